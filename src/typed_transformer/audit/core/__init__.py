"""The audit's core: what a candidate is compared with and how. Conventions (what the paper leaves open), the
reference attention, the checks and their runner, the report, inference of a function's conventions and the causes it
names."""
