//! adversarial
