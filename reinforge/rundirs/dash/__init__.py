"""`reinforge dash`: a web app that reads run directories (curves, time split, trajectories
token by token). It holds no state of its own and nothing in training imports it."""
