"""Running a plan and watching it: the executor, drift monitor, target recovery."""
