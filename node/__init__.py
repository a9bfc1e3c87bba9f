"""The node runtime both node services build on: `NodeCore` and the flags every node takes, the
engine thread, the control and metrics HTTP apps, the node's NIXL agent across ranks."""
