"""The benchmark, `python -m bench.verify`: the sweep (verify), its table, CSV and plot (report, plot), the last
committed measurements beside the model's readings (measured), and the kernels outside this project it times
beside ours (baselines; the Hopper peers: peers, peer_bundle). Imports bench.core and bench.model."""
