"""The draft-budget planner: the step cost per device and context (costmodel), the expected acceptance
of a tree (acceptance, profiles in integration/profiles/), the budget choice and --budget auto
(budget). Reads the loop's model shapes (integration.loop).
"""
