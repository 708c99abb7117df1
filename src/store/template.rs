//! Expands the Lua templates of the Redis store's straight-line scripts
//! (`scripts/straight_*.lua`) for a given number of windows.
//!
//! A template is Lua with three additions:
//! - lines between a line `--$each` and a line `--$end` are written once per
//!   window, with `@` standing for the window's number (1, 2, ...);
//! - `$each(SEP){TEXT}` is TEXT once per window, `@` standing for its
//!   number, joined by SEP (TEXT holds no `}`, SEP no `)`);
//! - `$N` is the number of windows, and `$NAME` any variable given;
//! - in an `--$each` block, `$ISSHORTER` is `true` for every window but the
//!   last (the longest) and `false` for it: a constant the Lua compiler
//!   folds, where `@ < $N` would be a comparison made on every run;
//! - lines between `--$eachshorter` and `--$end` are written once per
//!   window but the last: code that only a shorter window runs, not even
//!   a folded test for the longest (Redis's Lua still runs a jump for
//!   `if false and ...`).
//!
//! The scripts are fixed at compile time and expanded once per store, so
//! a malformed template is a bug the unit tests catch, not an input error.

/// Expands `template` for `n` windows, with `vars` for `$NAME`.
pub(crate) fn expand(template: &str, n: usize, vars: &[(&str, String)]) -> String {
    let mut out = String::with_capacity(template.len() * 2);
    // (The lines of the block being read, and its last window.)
    let mut block: Option<(Vec<&str>, usize)> = None;
    for line in template.lines() {
        match (line.trim(), &mut block) {
            ("--$each", None) => block = Some((Vec::new(), n)),
            ("--$eachshorter", None) => block = Some((Vec::new(), n.saturating_sub(1))),
            ("--$end", Some((lines, last))) => {
                for i in 1..=*last {
                    let shorter = if i < n { "true" } else { "false" };
                    for l in lines.iter() {
                        let l = l
                            .replace("$ISSHORTER", shorter)
                            .replace('@', &i.to_string());
                        out.push_str(&inline(&l, n, vars));
                        out.push('\n');
                    }
                }
                block = None;
            }
            (_, Some((lines, _))) => lines.push(line),
            (_, None) => {
                out.push_str(&inline(line, n, vars));
                out.push('\n');
            }
        }
    }
    out
}

/// One line: `$each(SEP){TEXT}`, then the variables.
fn inline(line: &str, n: usize, vars: &[(&str, String)]) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find("$each(") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "$each(".len()..];
        let parsed = after.find("){").and_then(|close| {
            let sep = &after[..close];
            let body = &after[close + 2..];
            body.find('}')
                .map(|end| (sep, &body[..end], &body[end + 1..]))
        });
        let Some((sep, text, tail)) = parsed else {
            out.push_str(&rest[at..]);
            rest = "";
            break;
        };
        let parts: Vec<String> = (1..=n).map(|i| text.replace('@', &i.to_string())).collect();
        out.push_str(&parts.join(sep));
        rest = tail;
    }
    out.push_str(rest);
    let mut out = out.replace("$N", &n.to_string());
    // (A value of several lines is indented as the line it goes in.)
    let indent = &line[..line.len() - line.trim_start().len()];
    for (name, value) in vars {
        let name = format!("${name}");
        if out.contains(&name) {
            out = out.replace(&name, &value.replace('\n', &format!("\n{indent}")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn blocks_lists_and_variables_expand_per_window() {
        let template = "local $each(, ){d@, n@} = f('$each(){i8i8}')\n--$each\nx@ = x@ + $K\n--$end\nreturn { $each(, ){r@} }, $N\n";
        let out = expand(template, 3, &[("K", "7".to_owned())]);
        assert_eq!(
            out,
            "local d1, n1, d2, n2, d3, n3 = f('i8i8i8i8i8i8')\nx1 = x1 + 7\nx2 = x2 + 7\nx3 = x3 + 7\nreturn { r1, r2, r3 }, 3\n"
        );
        let out = expand("--$each\nif $ISSHORTER and s@ then end\n--$end\n", 2, &[]);
        assert_eq!(out, "if true and s1 then end\nif false and s2 then end\n");
        let out = expand("--$eachshorter\ns@()\n--$end\nz()\n", 3, &[]);
        assert_eq!(out, "s1()\ns2()\nz()\n");
        assert_eq!(expand("--$eachshorter\ns@()\n--$end\n", 1, &[]), "");
        // (Outside a block it is left as it is, for the template tests to
        // find: no variable's name starts it.)
        let out = expand("x = $ISSHORTER + $SHORT\n", 1, &[("SHORT", "8".to_owned())]);
        assert_eq!(out, "x = $ISSHORTER + 8\n");
    }

    #[test]
    fn the_store_templates_expand_completely() {
        for algorithm in [
            crate::Algorithm::SlidingLog,
            crate::Algorithm::SlidingWindow,
            crate::Algorithm::FixedWindow,
            crate::Algorithm::TokenBucket,
        ] {
            for n in 1..=5 {
                let script = crate::store::redis::straight_lua(algorithm, n).unwrap_or_default();
                let code = script.lines().filter(|l| !l.trim_start().starts_with("--"));
                for line in code {
                    assert!(!line.contains(['@', '$']), "{algorithm:?} x{n}: {line}");
                    // (Alone, it returns its answer.)
                    assert!(!line.contains("replies"), "{algorithm:?} x{n}: {line}");
                }
                assert!(
                    script.contains(&format!("d{n}, n{n}")),
                    "{algorithm:?} x{n}"
                );
                assert!(script.contains("return pack8("), "{algorithm:?} x{n}");
                // (Its last statement is an answer.)
                let last = script
                    .lines()
                    .map(str::trim)
                    .rfind(|l| !l.is_empty() && !l.starts_with("--"));
                assert!(
                    last.is_some_and(|l| l.starts_with("return ")),
                    "{algorithm:?} x{n}: {last:?}"
                );
                if let Some(batched) = crate::store::redis::batched_lua(algorithm, n) {
                    // (Each check reads its own key, and the batch's
                    // clock.)
                    let code: Vec<&str> = batched
                        .lines()
                        .filter(|l| !l.trim_start().starts_with("--"))
                        .collect();
                    for line in &code {
                        assert!(
                            !line.contains(['@', '$']),
                            "{algorithm:?} x{n} batched: {line}"
                        );
                        assert!(
                            !["ARGV[1]", "KEYS[1]", "KEYS[2]"]
                                .iter()
                                .any(|k| line.contains(k)),
                            "{algorithm:?} x{n} batched: {line}"
                        );
                    }
                    let code = code.join("\n");
                    // (Its numbers as the batch unpacked them, once for
                    // every run of checks that have the same; its answers
                    // in their places in the replies, not returned: its
                    // code runs inline, in the batch's loop.)
                    assert!(code.contains("KEYS[i]"));
                    assert_eq!(code.matches(", ARGV[g])").count(), 1);
                    assert!(!code.contains("ARGV[i]"));
                    assert!(code.contains("replies[i] = pack8("));
                    assert!(!code.contains("check("));
                    // (No path of a check's code falls through: it ends
                    // with an answer. The replies' list starts as the
                    // keys, so one that did would answer with its key.)
                    let lines: Vec<&str> = code.lines().map(str::trim).collect();
                    let end = lines.iter().position(|l| *l == "until true");
                    let last = end.and_then(|e| lines[..e].iter().rev().find(|l| !l.is_empty()));
                    assert!(
                        last.is_some_and(|l| l.starts_with("replies[i] =") && l.ends_with(" break")),
                        "{algorithm:?} x{n}: {last:?}"
                    );
                    assert_eq!(code.matches("redis.call('TIME')").count(), 1);
                }
            }
        }
    }

    #[test]
    fn a_value_of_several_lines_is_indented_as_its_line() {
        let out = expand(
            "if x then\n  $BODY\nend\n",
            1,
            &[("BODY", "a()\nb()".to_owned())],
        );
        assert_eq!(out, "if x then\n  a()\n  b()\nend\n");
    }

    #[test]
    fn a_malformed_list_is_left_as_written() {
        assert_eq!(expand("a $each(, b\n", 2, &[]), "a $each(, b\n");
    }
}
