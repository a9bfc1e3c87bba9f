"""The SLO planner (issue 43): from the routers' live metrics, the prefill and decode replica
counts that meet the deployment's SLOs at the least cost, found by the simulator.

Layered above `sim` (the search) and `operator` (the resource it scales); docs/autoscaling.md.
"""
