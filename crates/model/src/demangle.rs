/// A symbol name as people read it: Rust (legacy and v0) and C++ names
/// demangled (C++ without parameter lists), others as they are. Shared by
/// the agent's local symbolizer and the server's.
pub fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z")
        && let Ok(sym) = cpp_demangle::Symbol::new(name)
        && let Ok(s) = sym.demangle_with_options(&cpp_demangle::DemangleOptions::new().no_params())
    {
        return s;
    }
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn rust_cpp_and_plain_names() {
        assert_eq!(
            demangle("_ZN7chainrs9rust_leaf17h0123456789abcdefE"),
            "chainrs::rust_leaf"
        );
        assert_eq!(
            demangle("_RNvCs1234_7chainrs9rust_leaf"),
            "chainrs::rust_leaf"
        );
        assert_eq!(demangle("_ZN3foo3barEi"), "foo::bar");
        assert_eq!(demangle("main.leaf"), "main.leaf");
    }
}
