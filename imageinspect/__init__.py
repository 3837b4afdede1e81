"""imageinspect package."""
