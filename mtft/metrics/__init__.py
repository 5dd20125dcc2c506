"""The official metrics as plain functions (no data, no models): accuracy/F1/MCC/correlations, seqeval entity F1,
SQuAD v1.1 EM/F1, the SuperGLUE scores and diagnostics. Tasks pick theirs by name."""
