#!/bin/sh
# Runs on the host, with no boundary: which is why it can be granted once or for a
# session, never for a project.
exec git log --oneline -n "${1:-10}"
