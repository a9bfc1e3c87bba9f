"""Bounds on the tests' waits that only a hang reaches.

Tests wait for a state, never for a time, and must pass however slow the machine is (a
single core shared with other busy processes included). These bounds only turn a hang into
a failure; nothing that works is meant to come near them.
"""

# An HTTP answer, a stream's next line, a state to come about.
HANG_S = 120.0
# A process to start and answer (several nodes starting at once share the machine), or a
# subprocess to run to its end.
PROCESS_S = 600.0
