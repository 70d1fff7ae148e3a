//! The management API's OpenAPI 3 document, served by a real node at
//! `/api/v1/openapi.json`: it validates (openapi-spec-validator, from PyPI), and
//! every operation it lists is one the node serves (a request to it is answered
//! by its handler, not by the router's "no such route"), while a path it does
//! not list is not served. Every listed operation refuses a caller with no
//! token or a wrong one (401), and every changing one a read-only token (403).

mod common;
use common::*;
use serde_json::Value;

/// True when the router itself answered "no such route" or "method not
/// allowed" (handlers answer with a JSON `{"error": ...}` body).
fn unrouted(code: u16, body: &str) -> bool {
    code == 405 || (code == 404 && serde_json::from_str::<Value>(body).is_err())
}

#[test]
fn the_openapi_document_validates_and_lists_exactly_what_the_node_serves() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = one_file_lun_config(dir.path());
    let node = start_config(dir.path(), &cfg);
    let api = node.api.clone().expect("no API address in the banner");
    let admin = std::fs::read_to_string(dir.path().join("data/api/cli-token")).unwrap();
    let admin = format!("Authorization: Bearer {}", admin.trim());
    let ro = make_token(&dir.path().join("data"), "read-only", "reader");
    let ro = format!("Authorization: Bearer {ro}");

    // read-only tokens may read it; no token may not
    let (code, _) = http(&api, "GET", "/api/v1/openapi.json", &[], "");
    assert_eq!(code, 401);
    let (code, body) = http(&api, "GET", "/api/v1/openapi.json", &[&ro], "");
    assert_eq!(code, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).expect("JSON");
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));

    // a validator from PyPI accepts it
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, &body).unwrap();
    if have("python3") {
        let (ok, out) = run(
            "python3",
            &[
                "-c",
                "import json, sys\n\
                 try:\n    from openapi_spec_validator import validate\n\
                 except ImportError:\n    print('openapi-spec-validator is not installed'); sys.exit(3)\n\
                 validate(json.load(open(sys.argv[1])))\nprint('valid')",
                file.to_str().unwrap(),
            ],
        );
        if out.contains("not installed") {
            assert!(
                std::env::var("FREESAN_REQUIRE_TOOLS").is_err(),
                "openapi-spec-validator is required (scripts/test-all installs it)"
            );
        } else {
            assert!(ok && out.contains("valid"), "openapi-spec-validator: {out}");
        }
    }

    // every listed operation is served by its handler
    let paths = doc["paths"].as_object().expect("paths");
    assert!(paths.len() >= 20, "{} paths", paths.len());
    let mut operations = 0;
    for (path, ops) in paths {
        assert!(path.starts_with("/api/v1/") || path == "/metrics", "{path}");
        let concrete = path.replace("{name}", "no-such-object");
        for (method, op) in ops.as_object().unwrap() {
            let method = method.to_ascii_uppercase();
            let responses = op["responses"].as_object().expect("responses");
            assert!(
                responses.keys().any(|c| c.starts_with('2')),
                "{method} {path}: no success response described"
            );
            let body = if method == "POST" { "{}" } else { "" };
            // the door is shut to callers without the right token
            let wrong = "Authorization: Bearer fsn_not-a-token";
            for (who, auth, want) in [
                ("no token", None, 401),
                ("a wrong token", Some(wrong), 401),
                ("a read-only token", Some(ro.as_str()), 403),
            ] {
                if want == 403 && method == "GET" {
                    continue; // read-only tokens may read
                }
                let mut hs = vec!["Content-Type: application/json"];
                hs.extend(auth);
                let (code, answer) = http(&api, &method, &concrete, &hs, body);
                assert_eq!(code, want, "{method} {path} with {who}: {answer}");
            }
            let json = ["Content-Type: application/json", admin.as_str()];
            let (code, answer) = http(&api, &method, &concrete, &json, body);
            assert!(
                !unrouted(code, &answer),
                "{method} {path} is listed but not served: {code} {answer}"
            );
            operations += 1;
        }
    }
    eprintln!("{} paths, {operations} operations, all served", paths.len());
    // the check tells a served route from an unserved one
    let (code, answer) = http(&api, "GET", "/api/v1/no-such-route", &[&admin], "");
    assert!(unrouted(code, &answer), "{code} {answer}");
    let json = ["Content-Type: application/json", admin.as_str()];
    let (code, answer) = http(&api, "DELETE", "/api/v1/pools", &json, "{}");
    assert!(unrouted(code, &answer), "{code} {answer}");
}
