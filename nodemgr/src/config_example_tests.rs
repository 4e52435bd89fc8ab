//! `deploy/nodemgr.toml`, the example configuration `scripts/install.sh`
//! puts in `/etc/dilu`, against the parser: it names every key the daemon
//! reads, its commented defaults are the daemon's, and its examples parse.
//!
//! Conventions of the file: `# key = value` is a default; a value followed by
//! `# example` has no default (shown for its form); `# [tenants.NAME]` opens
//! an example tenant.

use super::{Config, FileConfig, FileTenant};
use serde::de::{self, Deserialize, Visitor};

const EXAMPLE: &str = include_str!("../../deploy/nodemgr.toml");

/// The field names a `#[derive(Deserialize)]` struct asks its deserializer
/// for: the keys the daemon reads, straight from the parser.
fn keys_of<T: for<'de> Deserialize<'de>>() -> Vec<&'static str> {
    let mut catcher = FieldCatcher(&[]);
    let _ = T::deserialize(&mut catcher);
    assert!(!catcher.0.is_empty(), "not a struct");
    catcher.0.to_vec()
}

struct FieldCatcher(&'static [&'static str]);

impl<'de> de::Deserializer<'de> for &mut FieldCatcher {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("only a struct's field names are caught"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = fields;
        Err(de::Error::custom("caught"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// One commented `key = value` line of the example.
struct Line {
    /// The tenant table it is under (None: top level).
    table: Option<String>,
    key: String,
    /// The line uncommented.
    toml: String,
    is_default: bool,
}

fn example_lines() -> Vec<Line> {
    let mut table = None;
    let mut lines = Vec::new();
    for raw in EXAMPLE.lines() {
        let Some(text) = raw.strip_prefix("# ") else {
            continue;
        };
        if let Some(name) = text
            .strip_prefix("[tenants.")
            .and_then(|t| t.strip_suffix(']'))
        {
            table = Some(name.to_string());
            continue;
        }
        let Some((key, value)) = text.split_once(" = ") else {
            continue;
        };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            continue;
        }
        lines.push(Line {
            table: table.clone(),
            key: key.to_string(),
            toml: text.to_string(),
            is_default: !value.contains("# example"),
        });
    }
    lines
}

#[test]
fn the_example_names_every_key_the_daemon_reads() {
    let lines = example_lines();
    for key in keys_of::<FileConfig>() {
        if key == "tenants" {
            assert!(
                lines.iter().any(|l| l.table.is_some()),
                "deploy/nodemgr.toml shows no [tenants.NAME] table"
            );
            continue;
        }
        assert!(
            lines.iter().any(|l| l.table.is_none() && l.key == key),
            "deploy/nodemgr.toml does not list the key `{key}`"
        );
    }
    for key in keys_of::<FileTenant>() {
        assert!(
            lines.iter().any(|l| l.table.is_some() && l.key == key),
            "deploy/nodemgr.toml does not show the tenant key `{key}`"
        );
    }
}

#[test]
fn the_examples_commented_defaults_are_the_daemons_defaults() {
    let defaults: String = example_lines()
        .iter()
        .filter(|l| l.table.is_none() && l.is_default)
        .map(|l| format!("{}\n", l.toml))
        .collect();
    let parsed = Config::parse(&defaults)
        .unwrap_or_else(|e| panic!("deploy/nodemgr.toml's defaults do not parse: {e}"));
    assert_eq!(
        format!("{parsed:?}"),
        format!("{:?}", Config::default()),
        "deploy/nodemgr.toml shows defaults the daemon does not have:\n{defaults}"
    );
    // The file as shipped (everything commented) is the defaults too.
    assert_eq!(
        format!("{:?}", Config::parse(EXAMPLE).unwrap()),
        format!("{:?}", Config::default())
    );
}

#[test]
fn every_example_line_uncommented_is_accepted() {
    let dir = std::env::temp_dir().join(format!("dilu-config-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A tenant's `profile` must name a file that exists: one `dilu profile` wrote.
    let profile = dir.join("serve.profile.toml");
    std::fs::write(
        &profile,
        "class = \"latency\"\nslo_ms = 8.0\nbatch = 16\nsm_request = 30\nsm_limit = 50\n\
         throughput_at_request = 100.0\nthroughput_at_limit = 120.0\ntrials = 14\nmethod = \"dilu\"\n",
    )
    .unwrap();
    let mut text = String::new();
    let mut table = None;
    for line in example_lines() {
        if line.table != table {
            if let Some(name) = &line.table {
                text.push_str(&format!("[tenants.{name}]\n"));
            }
            table = line.table.clone();
        }
        if line.key == "profile" {
            text.push_str(&format!("profile = {:?}\n", profile.display().to_string()));
        } else {
            text.push_str(&line.toml);
            text.push('\n');
        }
    }
    let config = Config::parse(&text)
        .unwrap_or_else(|e| panic!("the example uncommented does not parse: {e}\n{text}"));
    assert!(config.gpu_memory.is_some(), "{text}");
    assert_eq!(config.tenants.len(), 2, "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
