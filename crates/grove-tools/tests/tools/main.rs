//! Integration tests of the tool surface against real directories.

mod editor;
mod paths;
mod search;
mod support;
