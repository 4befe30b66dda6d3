"""monitor subpackage."""
