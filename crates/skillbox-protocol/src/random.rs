//! Random bytes from the kernel (`getrandom(2)`), for the ids and names that others must
//! not guess or collide with: session ids, secret placeholders, temp names. The one
//! source of randomness in skillbox; a failure is an error the caller sees, never a
//! quiet all-zero id or an endless retry.

use std::io;

/// Fills `bytes` from the kernel's random source. Blocks only until the kernel's pool is
/// first seeded (at boot); an interrupted call is retried, any other failure returned.
pub fn fill(bytes: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < bytes.len() {
        match rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "getrandom returned no bytes",
                ));
            }
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(io::Error::new(
                    io::Error::from(e).kind(),
                    format!("getrandom: {e}"),
                ));
            }
        }
    }
    Ok(())
}

/// `bytes` random bytes as lowercase hex (twice as many digits).
pub fn hex(bytes: usize) -> io::Result<String> {
    let mut raw = vec![0u8; bytes];
    fill(&mut raw)?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_every_byte_and_differs_each_time() {
        let (a, b) = (hex(16).unwrap(), hex(16).unwrap());
        assert_eq!(a.len(), 32);
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_ne!(a, b);
        // A large buffer is filled whole, not only its first chunk.
        let mut big = vec![0u8; 1 << 20];
        fill(&mut big).unwrap();
        assert!(big[big.len() - 4096..].iter().any(|&b| b != 0));
    }
}
