"""Helpers shared by more than one test package (issue 14: not imported from another
package's conftest.py)."""
