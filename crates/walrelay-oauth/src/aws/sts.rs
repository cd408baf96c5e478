//! STS `AssumeRoleWithWebIdentity` (EKS's IAM roles for service
//! accounts): the request (a form POST; the call is authenticated by the
//! web identity token itself, not signed) and its XML answer, read with a
//! small pure reader of the few elements needed rather than an XML
//! library.

use std::time::SystemTime;

use super::super::error::{excerpt, OAuthError};
use super::super::http::{form, Request, Url};
use super::super::token::Secret;
use super::credentials::{Credentials, WebIdentity};

const SERVICE: &str = "AWS STS";

/// Where STS is asked: `AWS_ENDPOINT_URL_STS`, else `AWS_ENDPOINT_URL`
/// (the SDKs' overrides, for VPC endpoints and test doubles), else the
/// regional endpoint of `region`. An override in plain http:// is refused
/// unless on loopback: the request carries the web identity token.
pub fn endpoint(region: &str, env: &impl Fn(&str) -> Option<String>) -> Result<Url, OAuthError> {
    let overridden = ["AWS_ENDPOINT_URL_STS", "AWS_ENDPOINT_URL"]
        .into_iter()
        .find_map(|name| env(name).filter(|v| !v.is_empty()).map(|v| (name, v)));
    if let Some((name, value)) = overridden {
        let url = Url::parse(value.trim()).map_err(|e| OAuthError::config(name, e))?;
        if !url.https && !url.is_loopback() {
            return Err(OAuthError::config(
                name,
                "plain http:// would send the web identity token in clear text; use https://",
            ));
        }
        return Ok(url);
    }
    let region = super::check_region(region)?;
    let domain = if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    };
    Url::parse(&format!("https://sts.{region}.{domain}/"))
        .map_err(|e| OAuthError::config("aws_region", e))
}

/// The `AssumeRoleWithWebIdentity` request for `identity` with `token`
/// (the file's contents) to `endpoint`. The token goes in the body, not
/// the URL, so that no proxy log holds it.
#[must_use]
pub fn request(endpoint: &Url, identity: &WebIdentity, token: &str) -> Request {
    Request {
        method: "POST",
        url: endpoint.clone(),
        headers: vec![
            (
                "Content-Type".to_owned(),
                "application/x-www-form-urlencoded".to_owned(),
            ),
            ("User-Agent".to_owned(), super::super::USER_AGENT.to_owned()),
        ],
        body: form(&[
            ("Action", "AssumeRoleWithWebIdentity"),
            ("Version", "2011-06-15"),
            ("RoleArn", &identity.role_arn),
            ("RoleSessionName", &identity.session_name),
            ("WebIdentityToken", token),
        ]),
    }
}

/// The credentials in STS's answer, or its error (`Code: Message`).
pub fn parse_response(endpoint: &str, status: u16, body: &[u8]) -> Result<Credentials, OAuthError> {
    let text = String::from_utf8_lossy(body);
    if !(200..300).contains(&status) {
        let answer = match (element(&text, "Code"), element(&text, "Message")) {
            (Some(code), Some(message)) => format!("{code}: {}", excerpt(&message, 300)),
            (Some(code), None) => code,
            _ => excerpt(&text, 200),
        };
        return Err(OAuthError::Refused {
            service: SERVICE,
            endpoint: endpoint.to_owned(),
            status,
            answer,
            advice: "check AWS_ROLE_ARN, the role's trust policy for this service account, and \
                     AWS_WEB_IDENTITY_TOKEN_FILE",
        });
    }
    let unreadable = |what: &str| OAuthError::Unreadable {
        service: SERVICE,
        endpoint: endpoint.to_owned(),
        reason: format!("no {what} in the AssumeRoleWithWebIdentity answer"),
    };
    let credentials = element(&text, "Credentials").ok_or_else(|| unreadable("Credentials"))?;
    let field = |name: &str| element(&credentials, name).ok_or_else(|| unreadable(name));
    let expiration = field("Expiration")?;
    let expires =
        humantime::parse_rfc3339_weak(&expiration).map_err(|e| OAuthError::Unreadable {
            service: SERVICE,
            endpoint: endpoint.to_owned(),
            reason: format!("Expiration `{}`: {e}", excerpt(&expiration, 40)),
        })?;
    Ok(Credentials {
        access_key_id: field("AccessKeyId")?,
        secret_access_key: Secret::new(field("SecretAccessKey")?),
        session_token: Some(Secret::new(field("SessionToken")?)),
        expires: Some(expires),
    })
}

/// The text inside the first `<name>...</name>` of `xml` (namespace
/// prefixes and attributes are not expected in STS's answer, but an
/// attribute on the opening tag is tolerated), entities decoded.
#[must_use]
pub fn element(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}");
    let close = format!("</{name}>");
    let mut from = 0;
    let start = loop {
        let at = from + xml[from..].find(&open)?;
        let after = at + open.len();
        match xml[after..].chars().next() {
            Some('>') => break after + 1,
            Some(c) if c.is_whitespace() => break after + xml[after..].find('>')? + 1,
            _ => from = after,
        }
    };
    let end = start + xml[start..].find(&close)?;
    Some(unescape(xml[start..end].trim()))
}

/// XML's five predefined entities (what STS escapes in a token or ARN).
fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// The expiry as seconds since the epoch (for tests and logs).
#[must_use]
pub fn unix_secs(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of AWS's documented AssumeRoleWithWebIdentity answer.
    const ANSWER: &str = r#"<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:cdc:walrelay</SubjectFromWebIdentityToken>
    <AssumedRoleUser>
      <Arn>arn:aws:sts::123456789012:assumed-role/walrelay/walrelay</Arn>
      <AssumedRoleId>AROACLKWSDQRAOEXAMPLE:walrelay</AssumedRoleId>
    </AssumedRoleUser>
    <Credentials>
      <SessionToken>AQoDYXdzEE0a8ANXXXXX&amp;more</SessionToken>
      <SecretAccessKey>wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY</SecretAccessKey>
      <Expiration>2014-10-24T23:00:23Z</Expiration>
      <AccessKeyId>ASgeIAIOSFODNN7EXAMPLE</AccessKeyId>
    </Credentials>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata><RequestId>ad4156e9-bce1-11e2-82e6-6b6efEXAMPLE</RequestId></ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>"#;

    #[test]
    fn the_answer_gives_temporary_credentials() {
        let got = parse_response(
            "https://sts.eu-west-1.amazonaws.com/",
            200,
            ANSWER.as_bytes(),
        )
        .unwrap();
        assert_eq!(got.access_key_id, "ASgeIAIOSFODNN7EXAMPLE");
        assert_eq!(
            got.secret_access_key.expose(),
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"
        );
        assert_eq!(
            got.session_token.as_ref().map(Secret::expose),
            Some("AQoDYXdzEE0a8ANXXXXX&more")
        );
        // 2014-10-24T23:00:23Z
        assert_eq!(got.expires.map(unix_secs), Some(1_414_191_623));
    }

    #[test]
    fn an_error_answer_quotes_code_and_message() {
        let body = r#"<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <Error><Type>Sender</Type><Code>InvalidIdentityToken</Code>
    <Message>No OpenIDConnect provider found in your account for https://oidc.eks</Message>
  </Error><RequestId>x</RequestId></ErrorResponse>"#;
        let e = parse_response("https://sts.eu-west-1.amazonaws.com/", 400, body.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "AWS STS https://sts.eu-west-1.amazonaws.com/ refused the request (HTTP 400): \
                 InvalidIdentityToken: No OpenIDConnect provider found"
            ),
            "{e}"
        );
        let e = parse_response("u", 200, b"<x/>").unwrap_err().to_string();
        assert!(e.contains("no Credentials"), "{e}");
    }

    #[test]
    fn elements_are_found_by_exact_name() {
        let xml =
            "<AccessKeyIdX>no</AccessKeyIdX><AccessKeyId a=\"1\"> yes &lt;1&gt; </AccessKeyId>";
        assert_eq!(element(xml, "AccessKeyId").as_deref(), Some("yes <1>"));
        assert_eq!(element(xml, "Missing"), None);
        assert_eq!(element("<A>unclosed", "A"), None);
    }

    #[test]
    fn the_request_posts_the_token_in_the_form() {
        let identity = WebIdentity {
            token_file: "/t".into(),
            role_arn: "arn:aws:iam::123456789012:role/walrelay".into(),
            session_name: "walrelay".into(),
        };
        let none = |_: &str| None;
        assert!(endpoint("eu west", &none).is_err());
        let r = request(&endpoint("eu-west-1", &none).unwrap(), &identity, "eyJ.tok");
        assert_eq!(r.url.shown(), "https://sts.eu-west-1.amazonaws.com/");
        assert_eq!(
            String::from_utf8(r.body).unwrap(),
            "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&\
             RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fwalrelay&\
             RoleSessionName=walrelay&WebIdentityToken=eyJ.tok"
        );
        assert_eq!(
            endpoint("cn-north-1", &none).unwrap().shown(),
            "https://sts.cn-north-1.amazonaws.com.cn/"
        );
        let vpc = |name: &str| {
            (name == "AWS_ENDPOINT_URL")
                .then(|| "https://vpce-1.sts.eu-west-1.vpce.amazonaws.com".to_owned())
        };
        assert_eq!(
            endpoint("eu-west-1", &vpc).unwrap().shown(),
            "https://vpce-1.sts.eu-west-1.vpce.amazonaws.com/"
        );
        let clear =
            |name: &str| (name == "AWS_ENDPOINT_URL_STS").then(|| "http://sts.example/".to_owned());
        assert!(endpoint("eu-west-1", &clear)
            .unwrap_err()
            .to_string()
            .contains("clear text"));
    }
}
