use std::collections::HashMap;

use super::*;

fn plan_of(
    pairs: &[(&str, &str)],
    options: &OAuthOptions,
    env: &[(&str, &str)],
) -> Result<ProviderPlan, OAuthError> {
    let props: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    plan(
        |k| props.get(k).map(String::as_str),
        options,
        |k| env.get(k).cloned(),
    )
}

/// Properties as pairs.
type Props<'a> = &'a [(&'a str, &'a str)];

const OIDC: &[(&str, &str)] = &[
    ("sasl.mechanism", "OAUTHBEARER"),
    ("sasl.oauthbearer.method", "OIDC"),
    (ENDPOINT, "https://idp.example.com/token"),
    ("sasl.oauthbearer.client.id", "walrelay"),
    ("sasl.oauthbearer.client.secret", "s3cret"),
    ("sasl.oauthbearer.scope", "kafka"),
    (EXTENSIONS, "logicalCluster=lkc-1"),
];

fn with<'a>(base: &[(&'a str, &'a str)], extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut all: Vec<_> = base
        .iter()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
        .copied()
        .collect();
    all.extend(extra.iter().filter(|(_, v)| !v.is_empty()));
    all
}

#[test]
fn oidc_reads_librdkafkas_properties() {
    let ProviderPlan::Oidc { settings, ca_file } =
        plan_of(OIDC, &OAuthOptions::default(), &[]).unwrap()
    else {
        panic!("not OIDC");
    };
    assert_eq!(settings.endpoint.shown(), "https://idp.example.com/token");
    assert_eq!(settings.client_id, "walrelay");
    assert_eq!(settings.client_secret.expose(), "s3cret");
    assert_eq!(settings.scope.as_deref(), Some("kafka"));
    assert_eq!(
        settings.extensions.iter().collect::<Vec<_>>(),
        [("logicalCluster", "lkc-1")]
    );
    assert_eq!(ca_file, None);
    // librdkafka's older aliases and a private CA.
    let aliased = with(
        OIDC,
        &[
            ("sasl.oauthbearer.client.id", ""),
            ("sasl.oauthbearer.client.credentials.client.id", "other"),
            ("https.ca.location", "/etc/idp-ca.pem"),
        ],
    );
    let ProviderPlan::Oidc { settings, ca_file } =
        plan_of(&aliased, &OAuthOptions::default(), &[]).unwrap()
    else {
        panic!("not OIDC");
    };
    assert_eq!(settings.client_id, "other");
    assert_eq!(ca_file, Some(PathBuf::from("/etc/idp-ca.pem")));
}

#[test]
fn oidc_mistakes_are_refused_by_name() {
    let cases: &[(Props, &str, &str)] = &[
        (&[(ENDPOINT, "")], ENDPOINT, "needs it"),
        (
            &[(ENDPOINT, "http://idp.example.com/token")],
            ENDPOINT,
            "clear text",
        ),
        (
            &[("sasl.oauthbearer.client.secret", "")],
            "sasl.oauthbearer.client.secret",
            "needs it",
        ),
        (&[(EXTENSIONS, "auth=x")], EXTENSIONS, "reserved"),
        (
            &[(
                "sasl.oauthbearer.grant.type",
                "urn:ietf:params:oauth:grant-type:jwt-bearer",
            )],
            "grant.type",
            "client secret only",
        ),
        (&[(UNSECURE, "true")], UNSECURE, "contradicts"),
        (
            &[("sasl.oauthbearer.method", "kerberos")],
            "sasl.oauthbearer.method",
            "`kerberos`",
        ),
    ];
    for (extra, property, says) in cases {
        let e = plan_of(&with(OIDC, extra), &OAuthOptions::default(), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains(property) && e.contains(says), "{extra:?}: {e}");
        assert!(!e.contains("s3cret"), "{e}");
    }
    // Plain HTTP to the loopback is fine (tests, sidecars).
    let local = with(OIDC, &[(ENDPOINT, "http://127.0.0.1:8080/token")]);
    assert!(plan_of(&local, &OAuthOptions::default(), &[]).is_ok());
}

#[test]
fn msk_iam_is_a_walrelay_option_with_a_region() {
    let options = OAuthOptions {
        oauth_provider: Some(ProviderName::AwsMskIam),
        ..OAuthOptions::default()
    };
    let base = &[("sasl.mechanism", "OAUTHBEARER")];
    assert_eq!(
        plan_of(base, &options, &[("AWS_REGION", "eu-central-1")]).unwrap(),
        ProviderPlan::MskIam {
            region: "eu-central-1".into()
        }
    );
    let explicit = OAuthOptions {
        aws_region: Some("us-east-2".into()),
        ..options.clone()
    };
    assert_eq!(
        plan_of(base, &explicit, &[("AWS_REGION", "eu-central-1")]).unwrap(),
        ProviderPlan::MskIam {
            region: "us-east-2".into()
        }
    );
    let e = plan_of(base, &options, &[]).unwrap_err().to_string();
    assert!(e.contains("aws_region"), "{e}");
    let bad = OAuthOptions {
        aws_region: Some("evil.example/".into()),
        ..options.clone()
    };
    assert!(plan_of(base, &bad, &[]).is_err());
    let e = plan_of(OIDC, &options, &[("AWS_REGION", "eu-west-1")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("oauth_provider"), "{e}");
    let e = plan_of(
        &[(ENDPOINT, "https://x/")],
        &options,
        &[("AWS_REGION", "eu-west-1")],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains(ENDPOINT) && e.contains("OIDC setting"), "{e}");
}

#[test]
fn unsecured_tokens_only_when_asked_for_by_the_insecure_option() {
    let props = &[
        ("sasl.mechanism", "OAUTHBEARER"),
        (UNSECURE, "True"),
        ("sasl.oauthbearer.config", "principal=dev"),
    ];
    let e = plan_of(props, &OAuthOptions::default(), &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("insecure_allow_unsecured_jwt = true"), "{e}");
    let insecure = OAuthOptions {
        insecure_allow_unsecured_jwt: true,
        ..OAuthOptions::default()
    };
    let ProviderPlan::Unsecured(u) = plan_of(props, &insecure, &[]).unwrap() else {
        panic!("not unsecured");
    };
    assert_eq!(u.principal, "dev");
    // The option alone, without librdkafka's switch, is a mistake.
    let e = plan_of(OIDC, &insecure, &[]).unwrap_err().to_string();
    assert!(e.contains("insecure_allow_unsecured_jwt"), "{e}");
}

#[test]
fn no_provider_at_all_says_what_to_set() {
    let e = plan_of(
        &[("sasl.mechanism", "OAUTHBEARER")],
        &OAuthOptions::default(),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("sasl.oauthbearer.method=oidc") && e.contains("aws-msk-iam"),
        "{e}"
    );
}
