//! The RPC's messages: a request (a key) and a reply (a header and the
//! object), little-endian.

/// Bytes of a request.
pub const REQUEST: usize = 24;
/// Bytes of a reply before the object.
pub const REPLY_HEAD: usize = 40;
const MAGIC: u32 = u32::from_le_bytes(*b"FWF1");
const GET: u32 = 1;

/// A reply's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// The object follows.
    Found = 0,
    /// No such key.
    Missing = 1,
    /// The request was malformed.
    Bad = 2,
}

/// A request: fetch `key`; `id` comes back in the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The key.
    pub key: u64,
    /// The client's request number (a late reply to an earlier request,
    /// one that timed out, is told apart by it).
    pub id: u64,
}

impl Request {
    /// Write into `b` (at least [`REQUEST`] bytes).
    pub fn encode(&self, b: &mut [u8]) {
        b[..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&GET.to_le_bytes());
        b[8..16].copy_from_slice(&self.key.to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
    }

    /// Read from a received message; `None` when it is not a request.
    pub fn decode(b: &[u8]) -> Option<Request> {
        if b.len() < REQUEST || b[..4] != MAGIC.to_le_bytes() || b[4..8] != GET.to_le_bytes() {
            return None;
        }
        Some(Request {
            key: u64::from_le_bytes(b[8..16].try_into().ok()?),
            id: u64::from_le_bytes(b[16..24].try_into().ok()?),
        })
    }
}

/// A reply's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// Found, missing or bad.
    pub status: Status,
    /// The object's length (it follows the header).
    pub len: u32,
    /// The request's id.
    pub id: u64,
    /// The server's load word when it answered.
    pub load: u64,
    /// The object's offset in the table (for the client's address cache).
    pub off: u64,
    /// The object's version.
    pub ver: u64,
}

impl Reply {
    /// Write into `b` (at least [`REPLY_HEAD`] bytes).
    pub fn encode(&self, b: &mut [u8]) {
        b[..4].copy_from_slice(&(self.status as u32).to_le_bytes());
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.load.to_le_bytes());
        b[24..32].copy_from_slice(&self.off.to_le_bytes());
        b[32..40].copy_from_slice(&self.ver.to_le_bytes());
    }

    /// Read from a received message of `b.len()` bytes; `None` when it is
    /// not a reply (or shorter than its length says).
    pub fn decode(b: &[u8]) -> Option<Reply> {
        if b.len() < REPLY_HEAD {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let status = match u32::from_le_bytes(b[..4].try_into().ok()?) {
            0 => Status::Found,
            1 => Status::Missing,
            2 => Status::Bad,
            _ => return None,
        };
        let len = u32::from_le_bytes(b[4..8].try_into().ok()?);
        if status == Status::Found && b.len() < REPLY_HEAD + len as usize {
            return None;
        }
        Some(Reply {
            status,
            len,
            id: u64_at(8),
            load: u64_at(16),
            off: u64_at(24),
            ver: u64_at(32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_junk_is_refused() {
        let mut b = [0u8; REQUEST];
        let r = Request { key: 42, id: 7 };
        r.encode(&mut b);
        assert_eq!(Request::decode(&b), Some(r));
        assert_eq!(Request::decode(&b[..10]), None);
        b[0] ^= 1;
        assert_eq!(Request::decode(&b), None);
        let mut b = vec![0u8; REPLY_HEAD + 5];
        let y = Reply {
            status: Status::Found,
            len: 5,
            id: 9,
            load: 3,
            off: 4096,
            ver: 2,
        };
        y.encode(&mut b);
        assert_eq!(Reply::decode(&b), Some(y));
        assert_eq!(Reply::decode(&b[..REPLY_HEAD + 4]), None);
        b[0] = 9;
        assert_eq!(Reply::decode(&b), None);
    }
}
