"""Studies: grids of runs over seeds, run in parallel here or as Slurm job arrays, and aggregated."""
