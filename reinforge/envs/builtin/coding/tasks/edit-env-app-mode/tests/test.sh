#!/bin/bash
# Hidden tests, copied in after the agent phase. The candidate's code is imported from
# /app after the standard library (sys.path.append), never ahead of it.
if python3 -I /tests/test_task.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
