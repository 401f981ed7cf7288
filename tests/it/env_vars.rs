//! docs/api.md's table of environment variables is the registry's (`strata::env::ALL`):
//! every variable Strata reads is listed, with its default, and nothing else is.

#[test]
fn the_docs_list_every_environment_variable_the_registry_reads() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/api.md")).unwrap();
    let table =
        docs.split("## Environment variables").nth(1).expect("docs/api.md has an Environment variables section");
    let rows: Vec<&str> =
        table.lines().take_while(|l| !l.starts_with("## ")).filter(|l| l.starts_with("| `")).collect();
    let listed: Vec<&str> = rows.iter().filter_map(|r| r.split('`').nth(1)).collect();
    let names: Vec<&str> = strata::env::ALL.iter().map(|v| v.name).collect();
    assert_eq!(listed, names, "docs/api.md's table against strata::env::ALL, in order");
    for (row, var) in rows.iter().zip(strata::env::ALL) {
        assert!(row.contains(var.default), "{}: the docs give another default than {:?}", var.name, var.default);
        assert_eq!(row.contains("*(debug)*"), var.debug, "{}: debug or setting", var.name);
    }
}
