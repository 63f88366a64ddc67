//! The API's endpoints, written once: path, method, whether the admin token
//! guards it, and the label its metrics carry. Routing, auth, the request
//! metrics and the access log all read this table, so adding an endpoint
//! is one row here and one arm in `routes`' dispatch (which the compiler
//! holds to every variant).

/// One endpoint of the API. A path not in the table has none (`None`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Route {
    Health,
    Metrics,
    Register,
    Unregister,
    Workers,
    Query,
    QueryByHash,
    Dump,
    RegisterPeer,
    DeregisterPeer,
    Peers,
    ReopenLogs,
    Routed,
}

/// What the table says of one endpoint.
pub struct Spec {
    pub route: Route,
    pub method: &'static str,
    /// Also the `endpoint` label of its metrics.
    pub path: &'static str,
    /// Changes what the daemon listens to, so needs the admin token when set.
    pub mutating: bool,
}

const fn row(route: Route, method: &'static str, path: &'static str, mutating: bool) -> Spec {
    Spec { route, method, path, mutating }
}

/// Every endpoint, in the order of `Route`'s variants.
pub const TABLE: [Spec; 13] = [
    row(Route::Health, "GET", "/health", false),
    row(Route::Metrics, "GET", "/metrics", false),
    row(Route::Register, "POST", "/register", true),
    row(Route::Unregister, "POST", "/unregister", true),
    row(Route::Workers, "GET", "/workers", false),
    row(Route::Query, "POST", "/query", false),
    row(Route::QueryByHash, "POST", "/query_by_hash", false),
    row(Route::Dump, "GET", "/dump", false),
    row(Route::RegisterPeer, "POST", "/register_peer", true),
    row(Route::DeregisterPeer, "POST", "/deregister_peer", true),
    row(Route::Peers, "GET", "/peers", false),
    row(Route::ReopenLogs, "POST", "/reopen_logs", false),
    row(Route::Routed, "POST", "/routed", true),
];

/// Metric label of every path not in the table.
pub const UNKNOWN_LABEL: &str = "other";

/// The route of a request path (query string excluded).
pub fn route_of(path: &str) -> Option<Route> {
    TABLE.iter().find(|s| s.path == path).map(|s| s.route)
}

impl Route {
    /// Its row of the table.
    pub fn spec(self) -> &'static Spec {
        &TABLE[self as usize]
    }
}

/// The `endpoint` label of a request's metrics: its path, or `other`.
pub fn label(route: Option<Route>) -> &'static str {
    route.map_or(UNKNOWN_LABEL, |r| r.spec().path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_row_sits_at_its_variants_index() {
        for (i, s) in TABLE.iter().enumerate() {
            assert_eq!(s.route as usize, i, "{}", s.path);
            assert_eq!(route_of(s.path), Some(s.route));
        }
    }

    #[test]
    fn only_the_control_endpoints_need_the_token() {
        let guarded: Vec<&str> = TABLE.iter().filter(|s| s.mutating).map(|s| s.path).collect();
        assert_eq!(guarded, ["/register", "/unregister", "/register_peer", "/deregister_peer", "/routed"]);
    }

    #[test]
    fn unknown_paths_have_no_route_and_one_label() {
        assert_eq!(route_of("/nope"), None);
        assert_eq!(route_of("/query/"), None);
        assert_eq!(label(None), "other");
        assert_eq!(label(Some(Route::QueryByHash)), "/query_by_hash");
    }
}
