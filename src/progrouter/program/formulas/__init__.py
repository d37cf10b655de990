"""Pure functions of Program scheduling: the spec's formulas and ours, no state of their own."""
