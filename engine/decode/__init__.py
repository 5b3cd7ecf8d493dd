"""The decode loop: settings, the Decoder (AR and DFlash rounds), sampling, where acceptance is
decided, rollback of the target's caches, round statistics, events and the output."""
