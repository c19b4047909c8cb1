//! Integration tests of the tool surface against real directories.
