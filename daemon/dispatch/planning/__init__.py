"""From timings to a plan: cost model, kernel corpus, dynamic-programming planner, plan cache."""
