"""Memory before any GPU time: the model of a trial's peak, its calibration on rows, the state check. Pure."""
