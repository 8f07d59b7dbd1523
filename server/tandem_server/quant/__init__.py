"""Weight formats: how each linear layer holds its weight and multiplies by it, the schemes and kernels behind them
(one folder each), and the ordered steps that prepare a loaded model's weights."""
