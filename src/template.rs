//! Lock-name templates of the guard trigger (docs/design.md, "The guard"): `inventory:{item_id}`.
//!
//! `{col}` stands for the text of column `col` in the row being written; `{{`
//! and `}}` are literal braces. A template without placeholders names one lock
//! for the whole table. Parsing is pure; values are substituted as data and never
//! reach SQL.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Literal(String),
    Column(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pub parts: Vec<Part>,
}

impl Template {
    /// Parse a template, or say what is wrong with it.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.char_indices().peekable();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' if chars.peek().map(|&(_, n)| n) == Some('{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek().map(|&(_, n)| n) == Some('}') => {
                    chars.next();
                    literal.push('}');
                }
                '}' => return Err(format!("unmatched \"}}\" at byte {at}")),
                '{' => {
                    let mut column = String::new();
                    loop {
                        match chars.next() {
                            Some((_, '}')) => break,
                            Some((inner, '{')) => {
                                return Err(format!("\"{{\" inside a column reference at byte {inner}"))
                            }
                            Some((_, ch)) => column.push(ch),
                            None => return Err(format!("unterminated \"{{\" at byte {at}")),
                        }
                    }
                    if column.is_empty() {
                        return Err(format!("empty column reference \"{{}}\" at byte {at}"));
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Column(column));
                }
                other => literal.push(other),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Template { parts })
    }

    /// The columns the template refers to, in order, each once.
    pub fn columns(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for p in &self.parts {
            if let Part::Column(c) = p {
                if !out.contains(&c.as_str()) {
                    out.push(c);
                }
            }
        }
        out
    }

    /// Substitute column values. `value` returns the text of a column, `Ok(None)`
    /// when it is NULL; a NULL value is an error naming the column.
    pub fn render<E>(
        &self,
        mut value: impl FnMut(&str) -> Result<Option<String>, E>,
        null_error: impl Fn(&str) -> E,
    ) -> Result<String, E> {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Literal(s) => out.push_str(s),
                Part::Column(c) => match value(c)? {
                    Some(v) => out.push_str(&v),
                    None => return Err(null_error(c)),
                },
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lit(s: &str) -> Part {
        Part::Literal(s.into())
    }
    fn col(s: &str) -> Part {
        Part::Column(s.into())
    }

    fn render_with(t: &Template, values: &[(&str, Option<&str>)]) -> Result<String, String> {
        t.render(
            |c| Ok(values.iter().find(|(k, _)| *k == c).and_then(|(_, v)| v.map(String::from))),
            |c| format!("null {c}"),
        )
    }

    #[test]
    fn parses_columns_and_literals() {
        let t = Template::parse("inventory:{item_id}").unwrap();
        assert_eq!(t.parts, vec![lit("inventory:"), col("item_id")]);
        let t = Template::parse("{a}/{b}-{a}").unwrap();
        assert_eq!(t.parts, vec![col("a"), lit("/"), col("b"), lit("-"), col("a")]);
        assert_eq!(t.columns(), vec!["a", "b"]);
    }

    #[test]
    fn literal_template_names_one_lock() {
        let t = Template::parse("whole-table").unwrap();
        assert_eq!(t.columns(), Vec::<&str>::new());
        assert_eq!(render_with(&t, &[]).unwrap(), "whole-table");
    }

    #[test]
    fn doubled_braces_are_literal() {
        let t = Template::parse("{{x}}:{id}").unwrap();
        assert_eq!(t.parts, vec![lit("{x}:"), col("id")]);
        assert_eq!(render_with(&t, &[("id", Some("7"))]).unwrap(), "{x}:7");
        assert_eq!(Template::parse("}}{{").unwrap().parts, vec![lit("}{")]);
    }

    #[test]
    fn malformed_templates_are_rejected() {
        for bad in ["{", "a{b", "}", "a}b", "{}", "{a{b}}", "x{y"] {
            assert!(Template::parse(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn column_names_keep_case_spaces_and_unicode() {
        let t = Template::parse("{Item Id}:{名前}").unwrap();
        assert_eq!(t.columns(), vec!["Item Id", "名前"]);
    }

    #[test]
    fn values_are_substituted_verbatim() {
        let t = Template::parse("k:{v}").unwrap();
        for v in ["it's", "a\\b", "%s", "{x}", "}}", "line\nbreak", "'; DROP TABLE t; --", "ü€😀"] {
            assert_eq!(render_with(&t, &[("v", Some(v))]).unwrap(), format!("k:{v}"));
        }
    }

    #[test]
    fn null_values_are_errors_naming_the_column() {
        let t = Template::parse("k:{a}:{b}").unwrap();
        assert_eq!(render_with(&t, &[("a", Some("1")), ("b", None)]), Err("null b".to_string()));
    }

    /// Escape a literal so that it parses back to itself.
    fn escape(s: &str) -> String {
        s.replace('{', "{{").replace('}', "}}")
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in ".*") {
            let _ = Template::parse(&s);
        }

        #[test]
        fn escaped_literals_round_trip(s in ".*") {
            let t = Template::parse(&escape(&s)).unwrap();
            prop_assert_eq!(render_with(&t, &[]).unwrap(), s);
        }

        #[test]
        fn rendering_is_literal_then_value(prefix in ".*", column in "[^{}]+", value in ".*") {
            let t = Template::parse(&format!("{}{{{}}}", escape(&prefix), column)).unwrap();
            let rendered = render_with(&t, &[(column.as_str(), Some(value.as_str()))]).unwrap();
            prop_assert_eq!(rendered, format!("{prefix}{value}"));
        }

        #[test]
        fn parsed_parts_never_contain_empty_literals(s in "[a{}]{0,12}") {
            if let Ok(t) = Template::parse(&s) {
                for p in &t.parts {
                    if let Part::Literal(l) = p { prop_assert!(!l.is_empty(), "empty literal"); }
                    if let Part::Column(c) = p {
                        prop_assert!(!c.is_empty() && !c.contains(['{', '}']), "bad column {:?}", c);
                    }
                }
            }
        }
    }
}
