//! Text <-> tokens.
