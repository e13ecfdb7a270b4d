//! The expression language of `expr:`-backed resource types (a subset of
//! expr-lang): parsing to an AST and the compile-time checks `validate` runs.
//! Evaluation lives with the engine that runs resource stages.

mod budget;
mod error;
mod eval;
mod lexer;
mod parser;

pub use budget::Budget;
pub use eval::{eval, Env, EvalError};
pub use error::ParseError;
pub use parser::{parse, Expr};

/// Which stage an expression serves; decides what is in scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Check,
    In,
    Out,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Check => "check",
            Stage::In => "in",
            Stage::Out => "out",
        }
    }

    fn variables(self) -> &'static [&'static str] {
        match self {
            Stage::Check => &["source", "version"],
            Stage::In => &["source", "version", "params"],
            Stage::Out => &["source", "params"],
        }
    }
}

/// Functions every stage may call.
pub const BUILTINS: &[&str] = &[
    "map", "filter", "all", "any", "none", "one", "find", "findIndex", "count", "sortBy", "groupBy",
    "reduce", "len", "flatten", "concat", "take", "uniq", "first", "last", "reverse", "keys",
    "values", "get", "toJSON", "fromJSON", "float", "int", "string", "trim", "upper", "lower",
    "split", "join", "sum", "min", "max", "abs", "env", "fail", "http",
];

/// Functions only the `out` stage may call.
pub const OUT_ONLY: &[&str] = &["now", "date", "duration", "timezone", "file"];

/// Parses `src` and checks every free identifier and call against the stage's scope.
pub fn compile(src: &str, stage: Stage) -> Result<Expr, ParseError> {
    let e = parse(src)?;
    let mut scope: Vec<String> = Vec::new();
    check_names(&e, stage, &mut scope)?;
    Ok(e)
}

fn check_names(e: &Expr, stage: Stage, scope: &mut Vec<String>) -> Result<(), ParseError> {
    use Expr::*;
    match e {
        Nil | Bool(_) | Int(_) | Float(_) | Str(_) | Pointer(_) => Ok(()),
        Ident(name, pos) => {
            if scope.iter().any(|s| s == name) || stage.variables().contains(&name.as_str()) {
                Ok(())
            } else if BUILTINS.contains(&name.as_str()) || OUT_ONLY.contains(&name.as_str()) {
                Err(ParseError { message: format!("{name} is a function; call it as {name}(…)"), pos: *pos })
            } else {
                Err(ParseError {
                    message: format!(
                        "unknown name \"{name}\" (in {}: {}, let names and the built-in functions){}",
                        stage.name(),
                        stage.variables().join(", "),
                        crate::suggest::did_you_mean(name, stage.variables().iter().copied())
                    ),
                    pos: *pos,
                })
            }
        }
        Array(items) => items.iter().try_for_each(|i| check_names(i, stage, scope)),
        Map(entries) => entries.iter().try_for_each(|(_, v)| check_names(v, stage, scope)),
        Member { target, .. } => check_names(target, stage, scope),
        Index { target, index, .. } => {
            check_names(target, stage, scope)?;
            check_names(index, stage, scope)
        }
        Slice { target, from, to } => {
            check_names(target, stage, scope)?;
            if let Some(f) = from {
                check_names(f, stage, scope)?;
            }
            if let Some(t) = to {
                check_names(t, stage, scope)?;
            }
            Ok(())
        }
        Unary(_, x) => check_names(x, stage, scope),
        Binary(_, a, b) => {
            check_names(a, stage, scope)?;
            check_names(b, stage, scope)
        }
        Ternary(c, a, b) => {
            check_names(c, stage, scope)?;
            check_names(a, stage, scope)?;
            check_names(b, stage, scope)
        }
        Call { name, args, pos } => {
            if OUT_ONLY.contains(&name.as_str()) && stage != Stage::Out {
                return Err(ParseError { message: format!("{name}() is only available in the out stage"), pos: *pos });
            }
            if !BUILTINS.contains(&name.as_str()) && !OUT_ONLY.contains(&name.as_str()) {
                let cands = BUILTINS.iter().chain(OUT_ONLY).copied();
                return Err(ParseError {
                    message: format!("unknown function \"{name}\"{}", crate::suggest::did_you_mean(name, cands)),
                    pos: *pos,
                });
            }
            args.iter().try_for_each(|a| check_names(a, stage, scope))
        }
        Closure(body) => check_names(body, stage, scope),
        Let { name, value, body } => {
            check_names(value, stage, scope)?;
            scope.push(name.clone());
            let r = check_names(body, stage, scope);
            scope.pop();
            r
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_the_documented_syntax() {
        for src in [
            r#"[{ref: "abc"}]"#,
            r#"let base = source.base_url ?? "https://x"; http({url: base + "/a"}, {}).json?.items ?? []"#,
            "source.items | filter(#.ok) | map(({n: #.name, i: #index}))",
            "reduce(1..10, #acc + #, 0)",
            "len(source.list[1:3]) > 2 ? 'many' : \"few\" // a comment",
            "/* block */ not (version.n in ['1', '2']) and source.x matches '^a' || false",
            "{\"version.json\": toJSON(version), \"a/b.txt\": string(2 ** 3 % 5),}",
            "source.a?.b?.c == nil",
            "sortBy(source.xs, #.at) | first()",
        ] {
            compile(src, Stage::Check).unwrap_or_else(|e| panic!("{src}: {e}"));
        }
        compile(r#"{v: file("a/b", "d"), t: now()}"#, Stage::Out).unwrap();
    }

    #[test]
    fn reports_syntax_errors_with_a_position() {
        let e = compile("source.items | map(", Stage::Check).unwrap_err();
        assert!(e.pos > 0, "{e}");
        assert!(compile("1 +", Stage::Check).is_err());
        assert!(compile("[1, 2", Stage::Check).is_err());
        assert!(compile("\"unterminated", Stage::Check).is_err());
        assert!(compile("a # b", Stage::Check).is_err());
    }

    #[test]
    fn nesting_is_bounded_in_every_shape() {
        let deep = |open: &str, close: &str, n: usize| format!("{}1{}", open.repeat(n), close.repeat(n));
        assert!(compile(&deep("(", ")", 40), Stage::Check).is_ok(), "ordinary nesting is fine");
        for (what, src) in [
            ("parens", deep("(", ")", 100_000)),
            ("lists", deep("[", "]", 100_000)),
            ("unary", format!("{}1", "-".repeat(100_000))),
            ("power chain", vec!["2"; 100_000].join(" ** ")),
            ("ternaries", format!("{}1", "true ? 1 : ".repeat(100_000))),
            ("lets", format!("{}1", (0..100_000).map(|i| format!("let a{i} = 1; ")).collect::<String>())),
        ] {
            let e = compile(&src, Stage::Check).unwrap_err();
            assert!(e.message.contains("nests too deeply"), "{what}: {e}");
        }
    }

    #[test]
    fn reports_unknown_names_and_stage_limits() {
        let e = compile("sorce.uri", Stage::Check).unwrap_err();
        assert!(e.message.contains("unknown name \"sorce\"") && e.message.contains("did you mean \"source\""), "{e}");
        assert!(compile("params.x", Stage::Check).is_err());
        assert!(compile("params.x", Stage::In).is_ok());
        assert!(compile("now()", Stage::Check).unwrap_err().message.contains("only available in the out stage"));
        assert!(compile("file('x')", Stage::In).is_err());
        assert!(compile("frobnicate(1)", Stage::Check).unwrap_err().message.contains("unknown function"));
        assert!(compile("let n = 1; n + 1", Stage::Check).is_ok());
    }
}
