"""What runs the loop and measures it: the decode command and its --check (decode), the commit-length
probe (probe), end-to-end step timing (bench_e2e), bytes per part (traffic).
"""
