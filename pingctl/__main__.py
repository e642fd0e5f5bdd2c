from pingctl.cli import main

main()
