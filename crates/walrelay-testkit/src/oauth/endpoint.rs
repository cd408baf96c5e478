//! The token endpoint's decisions, without sockets or keys: who asks
//! (HTTP Basic, or the `client_id`/`client_secret` form fields), whether
//! the grant is client credentials, and the OAuth 2 error answers
//! (RFC 6749 section 5.2) when not.

use std::collections::HashMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use super::http::{form_decode, form_pairs, Request, Response};

/// A client the endpoint authenticated, and the scope it asked for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    pub client_id: String,
    pub scope: Option<String>,
}

/// Checks `request` against `clients` (id to secret).
pub(crate) fn authorize(
    request: &Request,
    clients: &HashMap<String, String>,
) -> Result<Grant, Response> {
    if request.method != "POST" {
        return Err(error(
            405,
            "invalid_request",
            "the token endpoint takes POST",
        ));
    }
    let form = form_pairs(&String::from_utf8_lossy(&request.body));
    let field = |name: &str| form.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    match field("grant_type").as_deref() {
        Some("client_credentials") => {}
        Some(other) => {
            return Err(error(
                400,
                "unsupported_grant_type",
                &format!("grant_type {other:?} is not client_credentials"),
            ))
        }
        None => return Err(error(400, "invalid_request", "no grant_type")),
    }
    let candidates = match request.header("authorization") {
        Some(header) => basic_credentials(header).ok_or_else(|| {
            error(
                401,
                "invalid_client",
                "a malformed Basic Authorization header",
            )
        })?,
        None => match (field("client_id"), field("client_secret")) {
            (Some(id), Some(secret)) => vec![(id, secret)],
            _ => {
                return Err(error(
                    401,
                    "invalid_client",
                    "no client authentication (HTTP Basic or client_id and client_secret)",
                ))
            }
        },
    };
    let known = |(id, secret): &(String, String)| clients.get(id) == Some(secret);
    match candidates.iter().find(|c| known(c)) {
        Some((id, _)) => Ok(Grant {
            client_id: id.clone(),
            scope: field("scope").filter(|s| !s.is_empty()),
        }),
        // The same answer for both, as a real server gives.
        None => Err(error(
            401,
            "invalid_client",
            &format!(
                "client {:?} is unknown or its secret is wrong",
                candidates[0].0
            ),
        )),
    }
}

/// `Basic base64(id:secret)`: as sent, and with each part form-decoded.
/// RFC 6749 section 2.3.1 has them form-encoded (Java's client does);
/// librdkafka sends them as they are, so a `+` or `%` may be either.
fn basic_credentials(header: &str) -> Option<Vec<(String, String)>> {
    let (scheme, value) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = String::from_utf8(STANDARD.decode(value.trim()).ok()?).ok()?;
    let (id, secret) = decoded.split_once(':')?;
    Some(vec![
        (id.to_owned(), secret.to_owned()),
        (form_decode(id), form_decode(secret)),
    ])
}

/// An OAuth 2 error answer.
pub(crate) fn error(status: u16, code: &str, description: &str) -> Response {
    Response::json(
        status,
        serde_json::json!({"error": code, "error_description": description}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clients() -> HashMap<String, String> {
        HashMap::from([
            ("relay".to_owned(), "s3cret".to_owned()),
            ("odd".to_owned(), "a+b%2".to_owned()),
        ])
    }

    fn post(body: &str, auth: Option<&str>) -> Request {
        Request {
            method: "POST".into(),
            path: "/token".into(),
            headers: auth
                .map(|a| vec![("authorization".to_owned(), a.to_owned())])
                .unwrap_or_default(),
            body: body.as_bytes().to_vec(),
        }
    }

    fn basic(id: &str, secret: &str) -> String {
        format!("Basic {}", STANDARD.encode(format!("{id}:{secret}")))
    }

    #[test]
    fn basic_auth_and_form_fields_both_authenticate() {
        let grant = authorize(
            &post(
                "grant_type=client_credentials&scope=kafka+relay",
                Some(&basic("relay", "s3cret")),
            ),
            &clients(),
        )
        .unwrap();
        assert_eq!(grant.client_id, "relay");
        assert_eq!(grant.scope.as_deref(), Some("kafka relay"));
        let grant = authorize(
            &post(
                "grant_type=client_credentials&client_id=relay&client_secret=s3cret",
                None,
            ),
            &clients(),
        )
        .unwrap();
        assert_eq!((grant.client_id.as_str(), grant.scope), ("relay", None));
        // Java's client form-encodes the Basic parts, librdkafka does not.
        let encoded = basic("relay", "s3cre%74");
        assert!(authorize(
            &post("grant_type=client_credentials", Some(&encoded)),
            &clients()
        )
        .is_ok());
        for secret in ["a+b%2", "a%2Bb%252"] {
            let grant = authorize(
                &post("grant_type=client_credentials", Some(&basic("odd", secret))),
                &clients(),
            );
            assert_eq!(grant.unwrap().client_id, "odd", "{secret}");
        }
    }

    #[test]
    fn wrong_secrets_unknown_clients_and_other_grants_are_refused() {
        let refused = |r: Request| authorize(&r, &clients()).unwrap_err();
        let wrong = refused(post(
            "grant_type=client_credentials",
            Some(&basic("relay", "nope")),
        ));
        assert_eq!(wrong.status, 401);
        assert_eq!(wrong.body["error"], "invalid_client");
        assert!(
            !wrong.body.to_string().contains("nope"),
            "the secret stays out of the answer"
        );
        let unknown = refused(post(
            "grant_type=client_credentials",
            Some(&basic("who", "s3cret")),
        ));
        assert_eq!(unknown.status, 401);
        assert_eq!(
            refused(post("grant_type=client_credentials", None)).status,
            401
        );
        assert_eq!(
            refused(post("grant_type=client_credentials", Some("Bearer x"))).status,
            401
        );
        let grant = refused(post("grant_type=password", Some(&basic("relay", "s3cret"))));
        assert_eq!(
            (grant.status, &grant.body["error"]),
            (400, &"unsupported_grant_type".into())
        );
        let mut get = post("", None);
        get.method = "GET".into();
        assert_eq!(refused(get).status, 405);
    }
}
