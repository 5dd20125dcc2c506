"""The bottom layer every other package may use: user-facing errors, row labels, process groups, files."""
