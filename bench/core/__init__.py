"""What every other room (and autotune/, integration/) measures with: the problem (inputs), its counted bytes, FLOPs
and floors (roofline), the device's measured ceilings (ceilings), the cold-L2 timers (timing) and one call checked
against the float64 reference and timed (measure). Imports nothing of bench."""
