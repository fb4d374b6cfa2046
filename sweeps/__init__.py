"""Ray fan-out of design evaluations and the Parquet result store (files and Ray live here, not in the libraries)."""
