from pingctl.cli.app import main

main()
