use std::collections::HashMap;

use super::pgpass::lookup_passfile;
use super::*;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

fn parse(s: &str) -> Result<Config, ConfigError> {
    Config::parse_with_env(s, env_of(&[("USER", "osuser")]))
}

#[test]
fn defaults() {
    let c = parse("").unwrap();
    assert_eq!(c.host_ports(), vec![("localhost", 5432)]);
    assert_eq!(c.get_user(), "osuser");
    assert_eq!(c.get_dbname(), "osuser");
    assert_eq!(c.get_application_name(), "walrelay");
    assert_eq!(c.get_sslmode(), SslMode::Prefer);
    assert_eq!(c.get_password(), None);
    assert_eq!(c.get_connect_timeout(), None);
    assert_eq!(c.get_channel_binding(), ChannelBinding::Prefer);
    assert_eq!(c.get_passfile(), None);
}

#[test]
fn user_fallbacks() {
    let c = Config::parse_with_env("", env_of(&[("LOGNAME", "ln")])).unwrap();
    assert_eq!(c.get_user(), "ln");
    let c = Config::parse_with_env("", env_of(&[("PGUSER", "pg"), ("USER", "u")])).unwrap();
    assert_eq!(c.get_user(), "pg");
    let e = Config::parse_with_env("host=x", env_of(&[])).unwrap_err();
    assert!(matches!(e, ConfigError::MissingUser), "{e}");
    assert!(e.to_string().contains("PGUSER"));
}

#[test]
fn keyword_value_basic() {
    let c = parse(
        "host=db.example.com port=6543 user=alice password=s3cret dbname=shop \
         application_name=relay sslmode=verify-full sslrootcert=/etc/ca.pem \
         connect_timeout=10 options='-c statement_timeout=0' channel_binding=require",
    )
    .unwrap();
    assert_eq!(c.host_ports(), vec![("db.example.com", 6543)]);
    assert_eq!(c.get_user(), "alice");
    assert_eq!(c.get_password().unwrap().expose(), "s3cret");
    assert_eq!(c.get_dbname(), "shop");
    assert_eq!(c.get_application_name(), "relay");
    assert_eq!(c.get_sslmode(), SslMode::VerifyFull);
    assert_eq!(
        c.get_sslrootcert(),
        Some(&RootCert::File("/etc/ca.pem".into()))
    );
    assert_eq!(c.get_connect_timeout(), Some(Duration::from_secs(10)));
    assert_eq!(c.get_options(), Some("-c statement_timeout=0"));
    assert_eq!(c.get_channel_binding(), ChannelBinding::Require);
}

#[test]
fn keyword_value_quoting() {
    // Doubled quote and backslash escapes inside quotes.
    let c = parse(r"password='it''s \\ x' user = bob").unwrap();
    assert_eq!(c.get_password().unwrap().expose(), r"it's \ x");
    assert_eq!(c.get_user(), "bob");
    // Backslash-escaped quote inside quotes, spaces preserved.
    let c = parse(r"password='a \'b\' c'").unwrap();
    assert_eq!(c.get_password().unwrap().expose(), "a 'b' c");
    // Unquoted value with escapes.
    let c = parse(r"password=a\ b\\c\'d").unwrap();
    assert_eq!(c.get_password().unwrap().expose(), r"a b\c'd");
    // Empty quoted value means unset.
    let c = parse("password='' user=u").unwrap();
    assert_eq!(c.get_password(), None);
    // Whitespace around '=' and tabs/newlines between pairs.
    let c = parse("  host =\tdb\n\nport= 1  ").unwrap();
    assert_eq!(c.host_ports(), vec![("db", 1)]);
    // Quote directly followed by the next pair, as libpq allows.
    let c = parse("user='u'dbname=d").unwrap();
    assert_eq!((c.get_user(), c.get_dbname()), ("u", "d"));
    // Non-ASCII is kept.
    let c = parse("password='pä ß'").unwrap();
    assert_eq!(c.get_password().unwrap().expose(), "pä ß");
    // Last duplicate wins.
    let c = parse("user=a user=b").unwrap();
    assert_eq!(c.get_user(), "b");
}

#[test]
fn keyword_value_syntax_errors() {
    let e = parse("host").unwrap_err();
    assert!(
        e.to_string().contains("missing \"=\" after \"host\""),
        "{e}"
    );
    let e = parse("=x").unwrap_err();
    assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
    let e = parse("password='unterminated").unwrap_err();
    assert!(e.to_string().contains("unterminated"), "{e}");
    assert!(!e.to_string().contains("unterminated'"), "{e}");
    let e = parse("host x=1").unwrap_err();
    assert!(e.to_string().contains("missing \"=\""), "{e}");
}

#[test]
fn unknown_and_unsupported_keywords() {
    let e = parse("hots=x").unwrap_err();
    assert!(matches!(e, ConfigError::UnknownKeyword { ref keyword } if keyword == "hots"));
    assert!(e.to_string().contains("\"hots\""), "{e}");
    let e = parse("replication=database").unwrap_err();
    assert!(e.to_string().contains("walrelay sets replication"), "{e}");
    let e = parse("postgresql://h/db?replication=database").unwrap_err();
    assert!(e.to_string().contains("replication"), "{e}");
    let e = parse("sslcert=/x").unwrap_err();
    assert!(matches!(e, ConfigError::UnsupportedKeyword { .. }), "{e}");
    let e = parse("gssencmode=require").unwrap_err();
    assert!(e.to_string().contains("gssencmode=require"), "{e}");
    let e = parse("sslmode=allow").unwrap_err();
    assert!(e.to_string().contains("prefer"), "{e}");
    // Harmless ones are accepted.
    parse(
        "sslcompression=1 gssencmode=disable sslsni=1 keepalives=1 keepalives_idle=30 \
         target_session_attrs=any client_encoding=UTF8",
    )
    .unwrap();
}

#[test]
fn invalid_values_are_actionable() {
    let e = parse("port=abc").unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("\"abc\"") && msg.contains("port") && msg.contains("65535"),
        "{msg}"
    );
    let e = parse("port=0").unwrap_err();
    assert!(matches!(
        e,
        ConfigError::InvalidValue {
            keyword: "port",
            ..
        }
    ));
    let e = parse("sslmode=strict").unwrap_err();
    assert!(e.to_string().contains("verify-full"), "{e}");
    let e = parse("connect_timeout=soon").unwrap_err();
    assert!(e.to_string().contains("connect_timeout"), "{e}");
    let e =
        Config::parse_with_env("", env_of(&[("USER", "u"), ("PGSSLMODE", "nope")])).unwrap_err();
    assert!(
        e.to_string().contains("environment variable PGSSLMODE"),
        "{e}"
    );
    let e = Config::parse_with_env("", env_of(&[("USER", "u"), ("PGPORT", "x")])).unwrap_err();
    assert!(e.to_string().contains("environment variable PGPORT"), "{e}");
}

#[test]
fn connect_timeout_rules() {
    let t = |s: &str| {
        parse(&format!("connect_timeout={s}"))
            .unwrap()
            .get_connect_timeout()
    };
    assert_eq!(t("0"), None);
    assert_eq!(t("-5"), None);
    assert_eq!(t("1"), Some(Duration::from_secs(2)));
    assert_eq!(t("30"), Some(Duration::from_secs(30)));
}

#[test]
fn url_full() {
    let c = parse(
        "postgresql://al%40ice:p%40ss%3Aw%2Fd@db.example.com:6543/my%20db?sslmode=require&\
         application_name=my%20app&options=-c%20synchronous_commit%3Doff&connect_timeout=5",
    )
    .unwrap();
    assert_eq!(c.get_user(), "al@ice");
    assert_eq!(c.get_password().unwrap().expose(), "p@ss:w/d");
    assert_eq!(c.host_ports(), vec![("db.example.com", 6543)]);
    assert_eq!(c.get_dbname(), "my db");
    assert_eq!(c.get_sslmode(), SslMode::Require);
    assert_eq!(c.get_application_name(), "my app");
    assert_eq!(c.get_options(), Some("-c synchronous_commit=off"));
    assert_eq!(c.get_connect_timeout(), Some(Duration::from_secs(5)));
}

#[test]
fn url_forms() {
    let c = parse("postgres://h").unwrap();
    assert_eq!(c.host_ports(), vec![("h", 5432)]);
    assert_eq!(c.get_user(), "osuser");
    let c = parse("postgresql://").unwrap();
    assert_eq!(c.host_ports(), vec![("localhost", 5432)]);
    let c = parse("postgresql:///db?host=/var/run/postgresql&port=5433").unwrap();
    assert_eq!(c.host_ports(), vec![("/var/run/postgresql", 5433)]);
    assert_eq!(c.get_dbname(), "db");
    let c = parse("postgresql://%2Ftmp%2Fsock/db").unwrap();
    assert_eq!(c.host_ports(), vec![("/tmp/sock", 5432)]);
    let c = parse("postgresql://[::1]:5433/db").unwrap();
    assert_eq!(c.host_ports(), vec![("::1", 5433)]);
    let c = parse("postgresql://[2001:db8::7]/db").unwrap();
    assert_eq!(c.host_ports(), vec![("2001:db8::7", 5432)]);
    let c = parse("postgresql://u@h1:1,[::1]:2,h3/db").unwrap();
    assert_eq!(c.host_ports(), vec![("h1", 1), ("::1", 2), ("h3", 5432)]);
    let c = parse("postgresql://h1,h2:7/db").unwrap();
    assert_eq!(c.host_ports(), vec![("h1", 5432), ("h2", 7)]);
    let c = parse("postgresql://:5433").unwrap();
    assert_eq!(c.host_ports(), vec![("localhost", 5433)]);
    let c = parse("postgresql://u:@h").unwrap();
    assert_eq!(c.get_password(), None);
    let c = parse("postgresql://h?ssl=true").unwrap();
    assert_eq!(c.get_sslmode(), SslMode::Require);
    let c = parse("postgresql://h/?application_name=a&&").unwrap();
    assert_eq!(c.get_application_name(), "a");
    // '+' is not a space in libpq URLs.
    let c = parse("postgresql://h/a+b").unwrap();
    assert_eq!(c.get_dbname(), "a+b");
    // Query parameters override the hierarchical part.
    let c = parse("postgresql://u@h/db?user=v&dbname=other").unwrap();
    assert_eq!((c.get_user(), c.get_dbname()), ("v", "other"));
}

#[test]
fn url_errors() {
    let e = parse("postgresql://h/db?sslmode").unwrap_err();
    assert!(e.to_string().contains("sslmode"), "{e}");
    let e = parse("postgresql://[::1/db").unwrap_err();
    assert!(e.to_string().contains("]"), "{e}");
    let e = parse("postgresql://h/d%zzb").unwrap_err();
    assert!(e.to_string().contains("percent"), "{e}");
    let e = parse("postgresql://h/d%00").unwrap_err();
    assert!(e.to_string().contains("%00"), "{e}");
    let e = parse("postgresql://h/d%ff").unwrap_err();
    assert!(e.to_string().contains("UTF-8"), "{e}");
    let e = parse("postgresql://h:notaport/db").unwrap_err();
    assert!(e.to_string().contains("notaport"), "{e}");
    let e = parse("postgresql://h/db?bogus=1").unwrap_err();
    assert!(matches!(e, ConfigError::UnknownKeyword { .. }), "{e}");
    let e = parse("postgresql://[::1]x/db").unwrap_err();
    assert!(matches!(e, ConfigError::InvalidUrl { .. }), "{e}");
    // Bad percent-encoding in the password does not echo it.
    let e = parse("postgresql://u:hunter%2@h").unwrap_err();
    assert!(!e.to_string().contains("hunter"), "{e}");
    let e = parse("postgresql://h/db?password=hunter%zz").unwrap_err();
    assert!(!e.to_string().contains("hunter"), "{e}");
}

#[test]
fn multiple_hosts_keyword_form() {
    let c = parse("host=a,b,c port=5").unwrap();
    assert_eq!(c.host_ports(), vec![("a", 5), ("b", 5), ("c", 5)]);
    let c = parse("host=a,b port=5,6").unwrap();
    assert_eq!(c.host_ports(), vec![("a", 5), ("b", 6)]);
    let e = parse("host=a,b,c port=5,6").unwrap_err();
    assert!(
        matches!(e, ConfigError::PortCountMismatch { hosts: 3, ports: 2 }),
        "{e}"
    );
}

#[test]
fn env_fills_gaps_and_string_wins() {
    let env = env_of(&[
        ("PGHOST", "envhost"),
        ("PGPORT", "7000"),
        ("PGUSER", "envuser"),
        ("PGPASSWORD", "envpass"),
        ("PGDATABASE", "envdb"),
        ("PGAPPNAME", "envapp"),
        ("PGSSLMODE", "require"),
        ("PGSSLROOTCERT", "/env/ca.pem"),
        ("PGCONNECT_TIMEOUT", "9"),
        ("PGPASSFILE", "/env/pgpass"),
        ("HOME", "/home/x"),
    ]);
    let c = Config::parse_with_env("", &env).unwrap();
    assert_eq!(c.host_ports(), vec![("envhost", 7000)]);
    assert_eq!(c.get_user(), "envuser");
    assert_eq!(c.get_password().unwrap().expose(), "envpass");
    assert_eq!(c.get_dbname(), "envdb");
    assert_eq!(c.get_application_name(), "envapp");
    assert_eq!(c.get_sslmode(), SslMode::Require);
    assert_eq!(
        c.get_sslrootcert(),
        Some(&RootCert::File("/env/ca.pem".into()))
    );
    assert_eq!(c.get_connect_timeout(), Some(Duration::from_secs(9)));
    assert_eq!(c.get_passfile(), Some(Path::new("/env/pgpass")));
    assert_eq!(
        c.get_default_sslrootcert(),
        Some(Path::new("/home/x/.postgresql/root.crt"))
    );

    let c = Config::parse_with_env(
        "postgresql://u:p@h:1/d?sslmode=disable&application_name=s",
        &env,
    )
    .unwrap();
    assert_eq!(c.host_ports(), vec![("h", 1)]);
    assert_eq!(c.get_user(), "u");
    assert_eq!(c.get_password().unwrap().expose(), "p");
    assert_eq!(c.get_dbname(), "d");
    assert_eq!(c.get_sslmode(), SslMode::Disable);
    assert_eq!(c.get_application_name(), "s");

    // Empty env values count as unset; HOME gives the default passfile.
    let c =
        Config::parse_with_env("user=u", env_of(&[("PGHOST", ""), ("HOME", "/home/y")])).unwrap();
    assert_eq!(c.host_ports(), vec![("localhost", 5432)]);
    assert_eq!(c.get_passfile(), Some(Path::new("/home/y/.pgpass")));
}

#[test]
fn fallback_application_name() {
    let c = parse("fallback_application_name=fb").unwrap();
    assert_eq!(c.get_application_name(), "fb");
    let c = parse("fallback_application_name=fb application_name=app").unwrap();
    assert_eq!(c.get_application_name(), "app");
}

#[test]
fn sslrootcert_system_rules() {
    let c = parse("sslrootcert=system").unwrap();
    assert_eq!(c.get_sslrootcert(), Some(&RootCert::System));
    assert_eq!(c.get_sslmode(), SslMode::VerifyFull);
    for weak in ["disable", "prefer", "require", "verify-ca"] {
        let e = parse(&format!("sslrootcert=system sslmode={weak}")).unwrap_err();
        assert!(
            matches!(e, ConfigError::WeakSslModeWithSystemRoots { .. }),
            "{weak}: {e}"
        );
    }
    parse("sslrootcert=system sslmode=verify-full").unwrap();
}

#[test]
fn password_never_in_debug_or_display() {
    let secret = "Sup3r-Secret-Pw";
    for s in [
        format!("postgresql://alice:{secret}@db/x?sslmode=require"),
        format!("host=db user=alice password={secret}"),
        format!("host=db user=alice password='{secret}'"),
    ] {
        let c = parse(&s).unwrap();
        assert_eq!(c.get_password().unwrap().expose(), secret);
        let dbg = format!("{c:?}");
        assert!(!dbg.contains(secret), "{dbg}");
        assert!(dbg.contains("********"), "{dbg}");
        let pretty = format!("{c:#?}");
        assert!(!pretty.contains(secret));
        assert!(!c.to_string().contains(secret));
        assert!(!c.redacted_url().contains(secret));
    }
    let p = Password::new(secret);
    assert_eq!(format!("{p:?}"), "********");
    assert_eq!(format!("{p}"), "********");
}

#[test]
fn redacted_url_round_trips() {
    let c = parse(
        "postgresql://al%40ice:pw@h1:1,[::1]:2/my%20db?sslmode=verify-ca&\
         sslrootcert=/ca.pem&application_name=x&connect_timeout=4",
    )
    .unwrap();
    let url = c.redacted_url();
    assert_eq!(
        url,
        "postgresql://al%40ice@h1:1,[::1]:2/my%20db?sslmode=verify-ca&application_name=x&\
         sslrootcert=%2Fca.pem&connect_timeout=4"
    );
    let back = parse(&url).unwrap();
    assert_eq!(back.host_ports(), c.host_ports());
    assert_eq!(back.get_user(), c.get_user());
    assert_eq!(back.get_dbname(), c.get_dbname());
    assert_eq!(back.get_sslmode(), c.get_sslmode());
    assert_eq!(back.get_sslrootcert(), c.get_sslrootcert());
    assert_eq!(back.get_password(), None);

    let c = parse("host=/var/run/postgresql user=u").unwrap();
    assert_eq!(
        c.redacted_url(),
        "postgresql://u@%2Fvar%2Frun%2Fpostgresql/u?sslmode=prefer&application_name=walrelay"
    );
}

#[test]
fn builder() {
    let c = Config::new()
        .host("h")
        .port(5433)
        .user("u")
        .password("pw")
        .dbname("d")
        .application_name("a")
        .options("-c x=y")
        .sslmode(SslMode::VerifyCa)
        .sslrootcert(RootCert::File("/ca".into()))
        .connect_timeout(Duration::from_secs(3))
        .channel_binding(ChannelBinding::Disable);
    c.validate().unwrap();
    assert_eq!(c.host_ports(), vec![("h", 5433)]);
    assert_eq!(c.get_port(), 5433);
    assert_eq!(c.get_password().unwrap().expose(), "pw");
    assert_eq!(c.get_dbname(), "d");
    assert_eq!(c.get_options(), Some("-c x=y"));
    assert_eq!(c.get_sslmode(), SslMode::VerifyCa);
    assert!(Config::new().validate().is_err());
}

#[test]
fn pgpass_parsing() {
    let file = "\
# comment
other:5432:*:*:nope
db.example.com:5432:shop:alice:first
*:*:*:alice:wild\\:card\\\\pw
host\\:colon:*:*:bob:escaped
localhost:*:*:carol:sock
";
    let l = |h: &str, p: u16, d: &str, u: &str| {
        lookup_passfile(file, h, p, d, u).map(|p| p.expose().to_string())
    };
    assert_eq!(
        l("db.example.com", 5432, "shop", "alice").as_deref(),
        Some("first")
    );
    assert_eq!(
        l("db.example.com", 5433, "shop", "alice").as_deref(),
        Some("wild:card\\pw")
    );
    assert_eq!(l("host:colon", 1, "x", "bob").as_deref(), Some("escaped"));
    assert_eq!(l("host", 1, "x", "bob"), None);
    assert_eq!(
        l("/var/run/postgresql", 5432, "x", "carol").as_deref(),
        Some("sock")
    );
    assert_eq!(l("elsewhere", 5432, "x", "dave"), None);
    // A literal, escaped star is not a wildcard.
    assert_eq!(lookup_passfile("\\*:*:*:*:pw\n", "h", 1, "d", "u"), None);
    // Too few fields never match; CRLF endings are fine.
    assert_eq!(lookup_passfile("h:1:d:u\n", "h", 1, "d", "u"), None);
    assert_eq!(
        lookup_passfile("h:1:d:u:pw\r\n", "h", 1, "d", "u").map(|p| p.expose().to_string()),
        Some("pw".into())
    );
}

#[cfg(unix)]
#[test]
fn pgpass_file_and_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pgpass");
    std::fs::write(&path, "h:5432:d:u:from-file\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let c = Config::new()
        .host("h")
        .user("u")
        .dbname("d")
        .passfile(&path);
    assert_eq!(c.resolve_password().unwrap().expose(), "from-file");
    assert_eq!(c.resolve_password_for("other", 5432), None);
    // An explicit password wins.
    let c2 = c.clone().password("explicit");
    assert_eq!(c2.resolve_password().unwrap().expose(), "explicit");
    // Group/world readable: ignored.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(c.resolve_password(), None);
    // Missing file: None.
    let c3 = Config::new()
        .host("h")
        .user("u")
        .passfile(dir.path().join("missing"));
    assert_eq!(c3.resolve_password(), None);
    // Via PGPASSFILE.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let c4 = Config::parse_with_env(
        "host=h user=u dbname=d",
        env_of(&[("PGPASSFILE", path.to_str().unwrap())]),
    )
    .unwrap();
    assert_eq!(c4.resolve_password().unwrap().expose(), "from-file");
}

#[test]
fn target_session_attrs_in_both_forms_and_from_the_environment() {
    use super::TargetSessionAttrs;
    let c = parse("host=a,b target_session_attrs=read-write").unwrap();
    assert_eq!(c.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
    let c = parse("postgresql://u@a,b/db?target_session_attrs=primary").unwrap();
    assert_eq!(c.get_target_session_attrs(), TargetSessionAttrs::Primary);
    assert!(
        c.redacted_url().contains("target_session_attrs=primary"),
        "{}",
        c.redacted_url()
    );
    assert_eq!(
        parse("host=a").unwrap().get_target_session_attrs(),
        TargetSessionAttrs::Any
    );
    let env = |name: &str| match name {
        "PGTARGETSESSIONATTRS" => Some("read-write".to_string()),
        "PGUSER" => Some("u".to_string()),
        _ => None,
    };
    let c = Config::parse_with_env("host=a", env).unwrap();
    assert_eq!(c.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
    // The string wins over the environment.
    let c = Config::parse_with_env("host=a target_session_attrs=any", env).unwrap();
    assert_eq!(c.get_target_session_attrs(), TargetSessionAttrs::Any);
    let e = Config::parse_with_env("host=a user=u", |n: &str| {
        (n == "PGTARGETSESSIONATTRS").then(|| "primry".to_string())
    })
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("PGTARGETSESSIONATTRS") && e.contains("primry"),
        "{e}"
    );
    let e = parse("target_session_attrs=standby")
        .unwrap_err()
        .to_string();
    assert!(e.contains("read-write"), "{e}");
}
