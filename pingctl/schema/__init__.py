"""The canonical measurement table, by concern: `columns` (the contract and its rules),
`times`, `addresses` (the one parser), `parquet` (files on disk) and `duck` (the checked
DuckDB view every step reads). Nothing here knows about any pipeline step."""
