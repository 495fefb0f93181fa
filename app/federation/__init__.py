"""Federation groups: clusters that opt in to being planned together (issue 16)."""
