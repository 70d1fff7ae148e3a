//! GF(2^8) arithmetic for RAID 6: field polynomial x^8+x^4+x^3+x^2+1 (0x11d),
//! generator 2, as in Linux md and SPDK. P is plain XOR; Q = sum g^i * D_i.
//!
//! Q is computed with Horner's rule (multiply by 2 is a shift and a conditional
//! XOR, done eight bytes at a time in a u64); multiplication by other constants goes
//! through a 64 KiB product table built once.

use std::sync::OnceLock;

struct Tables {
    exp: [u8; 512],
    log: [u8; 256],
    mul: Vec<[u8; 256]>,
}

fn tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        let mut exp = [0u8; 512];
        let mut log = [0u8; 256];
        let mut x: u16 = 1;
        for (i, e) in exp.iter_mut().enumerate().take(255) {
            *e = x as u8;
            log[x as usize] = i as u8;
            x <<= 1;
            if x & 0x100 != 0 {
                x ^= 0x11d;
            }
        }
        for i in 255..512 {
            exp[i] = exp[i - 255];
        }
        let mut mul = vec![[0u8; 256]; 256];
        for (a, row) in mul.iter_mut().enumerate().skip(1) {
            for (b, v) in row.iter_mut().enumerate().skip(1) {
                *v = exp[log[a] as usize + log[b] as usize];
            }
        }
        Tables { exp, log, mul }
    })
}

/// Product of two field elements.
#[cfg(test)]
pub fn mul(a: u8, b: u8) -> u8 {
    tables().mul[a as usize][b as usize]
}

/// g^i for the generator g = 2.
pub fn pow2(i: usize) -> u8 {
    tables().exp[i % 255]
}

/// Multiplicative inverse; `None` for zero.
pub fn inv(a: u8) -> Option<u8> {
    if a == 0 {
        return None;
    }
    let t = tables();
    Some(t.exp[255 - t.log[a as usize] as usize])
}

/// Discrete logarithm base 2; `None` for zero.
pub fn log2(a: u8) -> Option<u8> {
    if a == 0 {
        None
    } else {
        Some(tables().log[a as usize])
    }
}

/// `dst ^= src`, eight bytes at a time.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (a, b) in (&mut d).zip(&mut s) {
        let x = u64::from_ne_bytes(a.try_into().unwrap_or([0; 8]))
            ^ u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
        a.copy_from_slice(&x.to_ne_bytes());
    }
    for (a, b) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *a ^= *b;
    }
}

/// `dst ^= c * src`.
pub fn mul_xor_into(c: u8, dst: &mut [u8], src: &[u8]) {
    match c {
        0 => {}
        1 => xor_into(dst, src),
        _ => {
            let row = &tables().mul[c as usize];
            for (d, s) in dst.iter_mut().zip(src) {
                *d ^= row[*s as usize];
            }
        }
    }
}

/// `buf = c * buf`.
pub fn mul_in_place(c: u8, buf: &mut [u8]) {
    let row = &tables().mul[c as usize];
    for b in buf.iter_mut() {
        *b = row[*b as usize];
    }
}

fn mul2_in_place(buf: &mut [u8]) {
    let mut it = buf.chunks_exact_mut(8);
    for a in &mut it {
        let x = u64::from_ne_bytes(a.try_into().unwrap_or([0; 8]));
        let hi = x & 0x8080_8080_8080_8080;
        let lo = (x & 0x7f7f_7f7f_7f7f_7f7f) << 1;
        let y = lo ^ ((hi >> 7) * 0x1d);
        a.copy_from_slice(&y.to_ne_bytes());
    }
    for b in it.into_remainder() {
        let hi = *b & 0x80;
        *b <<= 1;
        if hi != 0 {
            *b ^= 0x1d;
        }
    }
}

/// Computes P (XOR of `data`) and, when asked, Q (sum of g^i * data[i]).
pub fn compute_pq(data: &[&[u8]], p: &mut [u8], q: Option<&mut [u8]>) {
    p.fill(0);
    for d in data {
        xor_into(p, d);
    }
    if let Some(q) = q {
        q.fill(0);
        for d in data.iter().rev() {
            mul2_in_place(q);
            xor_into(q, d);
        }
    }
}

/// Fills the missing (`None`) data columns from P and/or Q. Every present column
/// and parity has length `len`. Returns false when the erasures exceed what the
/// available parity can decide (the caller reports the stripe unavailable).
pub fn reconstruct(
    data: &mut [Option<Vec<u8>>],
    p: Option<&[u8]>,
    q: Option<&[u8]>,
    len: usize,
) -> bool {
    let missing: Vec<usize> = (0..data.len()).filter(|&i| data[i].is_none()).collect();
    let present_p = |data: &[Option<Vec<u8>>], skip: &[usize]| -> Option<Vec<u8>> {
        let mut acc = p?.to_vec();
        for (i, d) in data.iter().enumerate() {
            if !skip.contains(&i) {
                xor_into(&mut acc, d.as_deref()?);
            }
        }
        Some(acc)
    };
    let present_q = |data: &[Option<Vec<u8>>], skip: &[usize]| -> Option<Vec<u8>> {
        let mut acc = q?.to_vec();
        for (i, d) in data.iter().enumerate() {
            if !skip.contains(&i) {
                mul_xor_into(pow2(i), &mut acc, d.as_deref()?);
            }
        }
        Some(acc)
    };
    match missing.as_slice() {
        [] => true,
        [x] => {
            let x = *x;
            if let Some(v) = present_p(data, &[x]) {
                data[x] = Some(v);
                return true;
            }
            if let (Some(mut v), Some(c)) = (present_q(data, &[x]), inv(pow2(x))) {
                mul_in_place(c, &mut v);
                data[x] = Some(v);
                return true;
            }
            false
        }
        [x, y] => {
            let (x, y) = (*x, *y);
            let (Some(pp), Some(qq)) = (present_p(data, &[x, y]), present_q(data, &[x, y])) else {
                return false;
            };
            let Some(denom) = inv(pow2(x) ^ pow2(y)) else {
                return false;
            };
            // D_x = (Q' ^ g^y P') / (g^x ^ g^y); D_y = P' ^ D_x
            let mut dx = qq;
            mul_xor_into(pow2(y), &mut dx, &pp);
            mul_in_place(denom, &mut dx);
            let mut dy = pp;
            xor_into(&mut dy, &dx);
            debug_assert_eq!(dx.len(), len);
            data[x] = Some(dx);
            data[y] = Some(dy);
            true
        }
        _ => false,
    }
}

/// What the P/Q syndromes of one block say about a RAID 6 row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syndrome {
    /// P and Q agree with the data.
    Clean,
    /// Only P disagrees: P is bad.
    BadP,
    /// Only Q disagrees: Q is bad.
    BadQ,
    /// Both disagree consistently with one data column being bad.
    BadData(usize),
    /// The disagreement does not point at a single column.
    Unlocatable,
}

/// Locates a single bad column from the syndromes `sp = P ^ P'` and `sq = Q ^ Q'`
/// of one block, with `k` data columns.
pub fn locate(sp: &[u8], sq: &[u8], k: usize) -> Syndrome {
    let p_bad = sp.iter().any(|&b| b != 0);
    let q_bad = sq.iter().any(|&b| b != 0);
    match (p_bad, q_bad) {
        (false, false) => Syndrome::Clean,
        (true, false) => Syndrome::BadP,
        (false, true) => Syndrome::BadQ,
        (true, true) => {
            // a bad D_z gives sp = e, sq = g^z * e for every byte
            let mut z: Option<usize> = None;
            for (&a, &b) in sp.iter().zip(sq) {
                match (log2(a), log2(b)) {
                    (None, None) => continue,
                    (Some(la), Some(lb)) => {
                        let this = (lb as usize + 255 - la as usize) % 255;
                        if z.is_some_and(|z| z != this) {
                            return Syndrome::Unlocatable;
                        }
                        z = Some(this);
                    }
                    _ => return Syndrome::Unlocatable,
                }
            }
            match z {
                Some(z) if z < k => Syndrome::BadData(z),
                _ => Syndrome::Unlocatable,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn field_basics() {
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a).unwrap()), 1);
        }
        assert_eq!(mul(2, 0x80), 0x1d);
        let mut b = vec![0x80u8, 1, 0x40, 0xff, 3, 5, 7, 9, 0x81];
        let want: Vec<u8> = b.iter().map(|&x| mul(2, x)).collect();
        mul2_in_place(&mut b);
        assert_eq!(b, want);
    }

    #[test]
    fn recovers_any_two_erasures() {
        let k = 5;
        let len = 37;
        let data: Vec<Vec<u8>> = (0..k).map(|i| col(i as u8 * 7 + 1, len)).collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let mut p = vec![0u8; len];
        let mut q = vec![0u8; len];
        compute_pq(&refs, &mut p, Some(&mut q));
        for x in 0..k {
            for y in x..k {
                let mut cols: Vec<Option<Vec<u8>>> = data.iter().cloned().map(Some).collect();
                cols[x] = None;
                cols[y] = None;
                assert!(reconstruct(&mut cols, Some(&p), Some(&q), len));
                assert_eq!(cols[x].as_ref().unwrap(), &data[x]);
                assert_eq!(cols[y].as_ref().unwrap(), &data[y]);
                // one data + P lost: Q alone
                let mut cols: Vec<Option<Vec<u8>>> = data.iter().cloned().map(Some).collect();
                cols[x] = None;
                assert!(reconstruct(&mut cols, None, Some(&q), len));
                assert_eq!(cols[x].as_ref().unwrap(), &data[x]);
            }
        }
    }

    #[test]
    fn locates_a_bad_column() {
        let k = 4;
        let len = 16;
        let data: Vec<Vec<u8>> = (0..k).map(|i| col(i as u8 + 3, len)).collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let mut p = vec![0u8; len];
        let mut q = vec![0u8; len];
        compute_pq(&refs, &mut p, Some(&mut q));
        for z in 0..k {
            let mut bad = data.clone();
            bad[z][3] ^= 0x5a;
            bad[z][9] ^= 0x01;
            let refs: Vec<&[u8]> = bad.iter().map(|d| d.as_slice()).collect();
            let mut p2 = vec![0u8; len];
            let mut q2 = vec![0u8; len];
            compute_pq(&refs, &mut p2, Some(&mut q2));
            xor_into(&mut p2, &p);
            xor_into(&mut q2, &q);
            assert_eq!(locate(&p2, &q2, k), Syndrome::BadData(z));
        }
    }
}
