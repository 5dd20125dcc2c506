"""Studies: grids of runs over seeds, and their aggregation into tables, paired differences and plots."""
