"""Domain logic with no web framework in it: auth, limits, breakers, admission, selection."""
