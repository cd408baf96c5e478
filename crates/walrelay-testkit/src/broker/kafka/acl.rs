//! Granting and revoking Kafka ACLs, for tests of least privilege.
//!
//! librdkafka has an ACL admin API, but the `rdkafka` crate does not
//! expose it, and the distribution's `kafka-acls` tool is not among the
//! jars `scripts/install-kafka.sh` installs (and would cost a JVM start per
//! call). So this speaks the three requests itself, in their oldest
//! version Kafka 4 still takes (v1, before the compact encodings):
//! CreateAcls, DeleteAcls and DescribeAcls, over the node's PLAINTEXT
//! listener, whose principal is a super user ([`super::security`]).
//! A change is applied by the controller and then replayed by the broker's
//! authorizer; [`grant`] and [`revoke`] return once DescribeAcls, which
//! the broker answers from that authorizer, shows the result.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

const CREATE_ACLS: i16 = 30;
const DELETE_ACLS: i16 = 31;
const DESCRIBE_ACLS: i16 = 29;
const VERSION: i16 = 1;
const IO_TIMEOUT: Duration = Duration::from_secs(10);
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// What an ACL is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AclResource {
    /// A topic, by its literal name.
    Topic(String),
    /// A consumer group, by its literal name.
    Group(String),
    /// The cluster (`kafka-cluster`).
    Cluster,
}

impl AclResource {
    pub fn topic(name: &str) -> AclResource {
        AclResource::Topic(name.to_owned())
    }

    pub fn group(name: &str) -> AclResource {
        AclResource::Group(name.to_owned())
    }

    fn type_code(&self) -> i8 {
        match self {
            AclResource::Topic(_) => 2,
            AclResource::Group(_) => 3,
            AclResource::Cluster => 4,
        }
    }

    fn name(&self) -> &str {
        match self {
            AclResource::Topic(n) | AclResource::Group(n) => n,
            AclResource::Cluster => "kafka-cluster",
        }
    }
}

impl std::fmt::Display for AclResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AclResource::Topic(n) => write!(f, "topic {n}"),
            AclResource::Group(n) => write!(f, "group {n}"),
            AclResource::Cluster => f.write_str("the cluster"),
        }
    }
}

/// An operation an ACL allows (Kafka's `AclOperation` codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AclOperation {
    Read = 3,
    Write = 4,
    Create = 5,
    Delete = 6,
    Alter = 7,
    Describe = 8,
    IdempotentWrite = 12,
}

const LITERAL: i8 = 3;
const ALLOW: i8 = 3;
const ANY_HOST: &str = "*";

/// Allows `principal` (`User:name`) `operations` on `resource` from any
/// host; returns once the broker's authorizer has them.
pub fn grant(
    bootstrap: &str,
    principal: &str,
    resource: &AclResource,
    operations: &[AclOperation],
) -> anyhow::Result<()> {
    let mut body = Vec::new();
    put_i32(&mut body, operations.len() as i32);
    for op in operations {
        binding(&mut body, principal, resource, *op);
    }
    let mut resp = request(bootstrap, CREATE_ACLS, &body)?;
    let _throttle = resp.i32()?;
    for op in operations {
        let (code, message) = (resp.i16()?, resp.nullable_string()?);
        if code != 0 {
            bail!("granting {op:?} on {resource} to {principal}: error {code} ({message:?})");
        }
    }
    await_acls(bootstrap, principal, resource, operations, true)
}

/// Removes the ACLs that allow `principal` `operations` on `resource`;
/// returns once the broker's authorizer no longer has them.
pub fn revoke(
    bootstrap: &str,
    principal: &str,
    resource: &AclResource,
    operations: &[AclOperation],
) -> anyhow::Result<()> {
    let mut body = Vec::new();
    put_i32(&mut body, operations.len() as i32);
    for op in operations {
        // A filter has the binding's layout, with nullable strings.
        binding(&mut body, principal, resource, *op);
    }
    let mut resp = request(bootstrap, DELETE_ACLS, &body)?;
    let _throttle = resp.i32()?;
    let filters = resp.i32()?;
    for _ in 0..filters {
        let (code, message) = (resp.i16()?, resp.nullable_string()?);
        if code != 0 {
            bail!("revoking {operations:?} on {resource} from {principal}: error {code} ({message:?})");
        }
        for _ in 0..resp.i32()? {
            resp.i16()?;
            resp.nullable_string()?;
            resp.i8()?;
            resp.nullable_string()?;
            resp.i8()?;
            resp.nullable_string()?;
            resp.nullable_string()?;
            resp.i8()?;
            resp.i8()?;
        }
    }
    await_acls(bootstrap, principal, resource, operations, false)
}

/// The operations allowed to `principal` on `resource` (literal pattern).
pub fn allowed(
    bootstrap: &str,
    principal: &str,
    resource: &AclResource,
) -> anyhow::Result<Vec<AclOperation>> {
    let mut body = Vec::new();
    body.push(resource.type_code() as u8);
    put_string(&mut body, resource.name());
    body.push(LITERAL as u8);
    put_string(&mut body, principal);
    put_string(&mut body, ANY_HOST);
    body.push(1); // any operation
    body.push(ALLOW as u8);
    let mut resp = request(bootstrap, DESCRIBE_ACLS, &body)?;
    let _throttle = resp.i32()?;
    let (code, message) = (resp.i16()?, resp.nullable_string()?);
    if code != 0 {
        bail!("describing the ACLs on {resource}: error {code} ({message:?})");
    }
    let mut ops = Vec::new();
    for _ in 0..resp.i32()? {
        resp.i8()?;
        resp.nullable_string()?;
        resp.i8()?;
        for _ in 0..resp.i32()? {
            resp.nullable_string()?;
            resp.nullable_string()?;
            let op = resp.i8()?;
            resp.i8()?;
            ops.extend(ALL.iter().copied().filter(|o| *o as i8 == op));
        }
    }
    ops.sort();
    Ok(ops)
}

const ALL: [AclOperation; 7] = [
    AclOperation::Read,
    AclOperation::Write,
    AclOperation::Create,
    AclOperation::Delete,
    AclOperation::Alter,
    AclOperation::Describe,
    AclOperation::IdempotentWrite,
];

fn await_acls(
    bootstrap: &str,
    principal: &str,
    resource: &AclResource,
    operations: &[AclOperation],
    present: bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let now = allowed(bootstrap, principal, resource)?;
        if operations.iter().all(|op| now.contains(op) == present) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the broker's authorizer still allows {now:?} on {resource} to {principal} \
                 after {SETTLE_TIMEOUT:?} (wanted {operations:?} {})",
                if present { "present" } else { "absent" }
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn binding(body: &mut Vec<u8>, principal: &str, resource: &AclResource, op: AclOperation) {
    body.push(resource.type_code() as u8);
    put_string(body, resource.name());
    body.push(LITERAL as u8);
    put_string(body, principal);
    put_string(body, ANY_HOST);
    body.push(op as i8 as u8);
    body.push(ALLOW as u8);
}

fn put_i32(buf: &mut Vec<u8>, v: i32) {
    buf.extend_from_slice(&v.to_be_bytes());
}

fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as i16).to_be_bytes());
    buf.extend_from_slice(s.as_bytes());
}

/// One request (header v1) on a connection of its own; the response body
/// after its header (v0: the correlation id).
fn request(bootstrap: &str, api_key: i16, body: &[u8]) -> anyhow::Result<Response> {
    let addr = bootstrap.split(',').next().unwrap_or(bootstrap);
    let mut stream =
        TcpStream::connect(addr).with_context(|| format!("connecting to {addr} for ACLs"))?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut msg = Vec::new();
    msg.extend_from_slice(&api_key.to_be_bytes());
    msg.extend_from_slice(&VERSION.to_be_bytes());
    put_i32(&mut msg, 1);
    put_string(&mut msg, "walrelay-testkit-acl");
    msg.extend_from_slice(body);
    let mut frame = (msg.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&msg);
    stream.write_all(&frame)?;
    let mut len = [0u8; 4];
    stream
        .read_exact(&mut len)
        .with_context(|| format!("reading the answer to request {api_key} from {addr}"))?;
    let mut buf = vec![0u8; i32::from_be_bytes(len).max(0) as usize];
    stream.read_exact(&mut buf)?;
    let mut resp = Response { buf, at: 0 };
    if resp.i32()? != 1 {
        bail!("an answer from {addr} with another correlation id");
    }
    Ok(resp)
}

struct Response {
    buf: Vec<u8>,
    at: usize,
}

impl Response {
    fn take(&mut self, n: usize) -> anyhow::Result<&[u8]> {
        let end = self.at + n;
        if end > self.buf.len() {
            bail!("a short ACL answer ({} bytes)", self.buf.len());
        }
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn i8(&mut self) -> anyhow::Result<i8> {
        Ok(self.take(1)?[0] as i8)
    }

    fn i16(&mut self) -> anyhow::Result<i16> {
        Ok(i16::from_be_bytes(self.take(2)?.try_into()?))
    }

    fn i32(&mut self) -> anyhow::Result<i32> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into()?))
    }

    fn nullable_string(&mut self) -> anyhow::Result<Option<String>> {
        let len = self.i16()?;
        if len < 0 {
            return Ok(None);
        }
        Ok(Some(
            String::from_utf8_lossy(self.take(len as usize)?).into_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_is_encoded_in_v1_field_order() {
        let mut body = Vec::new();
        binding(
            &mut body,
            "User:r",
            &AclResource::topic("t"),
            AclOperation::Write,
        );
        assert_eq!(
            body,
            [
                &[2u8, 0, 1, b't', 3, 0, 6][..],
                b"User:r",
                &[0, 1, b'*', 4, 3],
            ]
            .concat()
        );
        let mut cluster = Vec::new();
        binding(
            &mut cluster,
            "User:r",
            &AclResource::Cluster,
            AclOperation::IdempotentWrite,
        );
        assert_eq!(&cluster[..3], &[4, 0, 13]);
        assert_eq!(&cluster[3..16], b"kafka-cluster");
        assert_eq!(cluster[cluster.len() - 2], 12);
    }

    #[test]
    fn answers_are_read_field_by_field() {
        let mut r = Response {
            buf: vec![0, 0, 0, 7, 0, 2, b'h', b'i', 0xff, 0xff, 5],
            at: 0,
        };
        assert_eq!(r.i32().unwrap(), 7);
        assert_eq!(r.nullable_string().unwrap().as_deref(), Some("hi"));
        assert_eq!(r.nullable_string().unwrap(), None);
        assert_eq!(r.i8().unwrap(), 5);
        assert!(r.i8().is_err(), "past the end");
    }
}
