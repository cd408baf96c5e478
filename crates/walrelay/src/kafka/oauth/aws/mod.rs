//! AWS: the MSK IAM token ([`msk`]) and what it is made from: SigV4
//! presigning ([`sigv4`]) and the credential chain ([`credentials`]:
//! environment, web identity through [`sts`], instance profile through
//! [`imds`]).
//!
//! Untested against AWS: the signing is checked against AWS's published
//! SigV4 examples and the answers' reading against AWS's documented
//! shapes, but no test here reaches MSK, STS or an EC2 metadata service.

pub mod credentials;
pub mod imds;
pub mod msk;
pub mod sigv4;
pub mod sts;
