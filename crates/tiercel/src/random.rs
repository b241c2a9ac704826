//! Randomness from the operating system, for both sides: tokens, nonces, incarnations, keys and
//! the seeds of ids.

/// 16 bytes from the OS random source (a token, a nonce, an incarnation).
pub(crate) fn bytes() -> std::io::Result<[u8; 16]> {
    random_array()
}

/// 32 bytes from the OS random source (a key).
pub(crate) fn bytes32() -> std::io::Result<[u8; 32]> {
    random_array()
}

fn random_array<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(b)
}
