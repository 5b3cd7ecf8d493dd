"""Training DFlash drafters against a frozen target."""
