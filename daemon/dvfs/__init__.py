"""DVFS: profiles as data applied as journaled transactions, the thermal guard, energy policies."""
