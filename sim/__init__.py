"""`tandem simulate` and `tandem plan`: a simulated clock and event queue driving Tandem's
real router policy and prefix index and each node's real scheduler and KV-cache manager,
with step-time, transfer and network stand-ins that live only in this package."""
