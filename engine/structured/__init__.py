"""Structured outputs: what a request asks for (`spec`) and its grammar compiled by llguidance
(`grammar`). Imports nothing else of the engine."""
