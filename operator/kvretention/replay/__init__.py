"""``kvretention replay``: recorded agent sessions sent to a running fleet, turn by turn, with the
share of each prompt the engine reports as read from its cache."""
