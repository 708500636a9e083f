"""The built-in environments, each loadable by name (`arithmetic`, `tictactoe`, `wordle`,
`calculator`) through the `reinforge.environments` entry points, like any user package."""
