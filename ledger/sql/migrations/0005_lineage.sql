-- Multi-agent lineage (CONFORMANCE Level 5, docs/lineage.md). Each operation row keeps
-- what its view's lineage status needs, so loading a batch's views stays one query on
-- the operations it touches: the known ancestor chain (parent first), the agents of
-- those ancestors, the ancestors currently containing it, whether the operation itself
-- is containing (it entered a state through a stop- or isolate-kind capability and has
-- not resumed since), and the credentials delegated to it. The columns are written
-- when an operation is linked to its parent (whichever of the two arrives first) and by
-- the lineage walk when an operation starts or stops containing: the only writes that
-- span operations.
ALTER TABLE operations
    ADD COLUMN delegated_credentials text[] NOT NULL DEFAULT '{}',
    ADD COLUMN ancestors             text[] NOT NULL DEFAULT '{}',
    ADD COLUMN lineage_agents        text[] NOT NULL DEFAULT '{}',
    ADD COLUMN contained_ancestors   text[] NOT NULL DEFAULT '{}',
    ADD COLUMN containing            boolean NOT NULL DEFAULT false,
    -- The decision that made the operation containing: "<operation>:<sequence>:<event>".
    ADD COLUMN containment_cause     text;
