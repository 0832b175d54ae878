-- The agents of every known descendant of an operation (docs/lineage.md): no approval
-- from a child or peer inside the delegation tree counts for an operation of that tree
-- (CONFORMANCE L5.5), so a view's lineage agents are its ancestors' and its
-- descendants' agents. Written when an operation is linked below its ancestors.
ALTER TABLE operations
    ADD COLUMN descendant_agents text[] NOT NULL DEFAULT '{}';
